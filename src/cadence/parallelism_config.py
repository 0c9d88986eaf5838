"""The reference's `parallelism_config` path (home: `cadence.plugins.parallelism`)."""

from __future__ import annotations

from .plugins.parallelism import ParallelismConfig

__all__ = ["ParallelismConfig"]
