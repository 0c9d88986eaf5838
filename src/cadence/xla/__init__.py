"""XLA (TPU) support: the runtime probe, SPMD plans and the XLA collectives; torch_xla is imported
only when used."""
