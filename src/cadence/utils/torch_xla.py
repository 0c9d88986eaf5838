"""Accelerate's `utils.torch_xla` path (home: `cadence.unsupported.torch_xla`)."""

from __future__ import annotations

from ..unsupported.torch_xla import (
    install_xla,
)

__all__ = [
    "install_xla",
]
