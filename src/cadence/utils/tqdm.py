"""Reference path: re-exports `cadence.runtime.tqdm` under Accelerate's `utils.tqdm` module path."""

from __future__ import annotations

from cadence.runtime.tqdm import (
    tqdm,
)

__all__ = [
    "tqdm",
]
