"""Accelerate's `utils.versions` path (home: `cadence.core.versions`)."""

from __future__ import annotations

from ..core.versions import compare_versions, is_torch_version

__all__ = [
    "compare_versions",
    "is_torch_version",
]
