"""Wrappers and helpers around what is trained: optimizer and scheduler wrappers, model unwrapping,
tensor helpers, joining uneven inputs."""
