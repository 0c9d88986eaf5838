"""Option records a user passes to the Accelerator (kwargs handlers, configurations)."""
