"""Reading plugin defaults from environment variables (the names the reference's launcher sets)."""

from __future__ import annotations

import os

_TRUE = {"y", "yes", "t", "true", "on", "1"}
_FALSE = {"n", "no", "f", "false", "off", "0"}


def as_bool(value: object, name: str = "value") -> bool:
    """`True`/`False` from a bool or one of the usual spellings ("true", "1", "no", ...)."""
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise ValueError(f"{name} must be a boolean (true/false, yes/no, 1/0), got {value!r}.")


def env_bool(name: str, default: bool = False) -> bool:
    raw = os.environ.get(name)
    return default if raw is None else as_bool(raw, name)


def env_text(name: str, default: str | None = None) -> str | None:
    return os.environ.get(name, default)


def rank_prefix() -> str:
    """ "[rank N] " inside a process group (so an error names the process it happened on), else ""."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return f"[rank {dist.get_rank()}] "
    return ""
