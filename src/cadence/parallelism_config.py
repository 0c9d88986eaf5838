"""Reference path: re-exports `cadence.plugins.parallelism` under Accelerate's `parallelism_config` module path."""

from __future__ import annotations

from .plugins.parallelism import ParallelismConfig

__all__ = ["ParallelismConfig"]
