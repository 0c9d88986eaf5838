"""Accelerate's `utils.transformer_engine` path (home: `cadence.unsupported.transformer_engine`)."""

from __future__ import annotations

from ..unsupported.transformer_engine import (
    apply_fp8_autowrap,
    contextual_fp8_autocast,
    convert_model,
    has_transformer_engine_layers,
)

__all__ = [
    "apply_fp8_autowrap",
    "contextual_fp8_autocast",
    "convert_model",
    "has_transformer_engine_layers",
]
