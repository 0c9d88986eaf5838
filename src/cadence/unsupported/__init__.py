"""Public names of Accelerate for hardware, services and integrations Cadence does not
drive (Megatron-LM, bitsandbytes, Transformer Engine, torch_xla/TPU, SageMaker, ...).

They exist so that a script importing them still imports; calling one raises
`UnsupportedFeatureError` (a `NotImplementedError`) that names what is missing and what to use
instead. Nothing here raises at import time.
"""

from __future__ import annotations

from typing import NoReturn


class UnsupportedFeatureError(NotImplementedError):
    """Raised when a reference-library feature Cadence does not implement is used."""


def unsupported(name: str, feature: str, instead: str = "") -> NoReturn:
    """Raise `UnsupportedFeatureError` for the public name `name` of the unsupported `feature`."""
    message = f"`{name}` is part of {feature}, which Cadence does not support."
    if instead:
        message += f" {instead}"
    raise UnsupportedFeatureError(message)


__all__ = ["UnsupportedFeatureError", "unsupported"]
