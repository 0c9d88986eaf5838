"""Accelerate's `utils.launch` path (homes: `cadence.launch.env`, whose names it re-exports, and
`cadence.commands.reference_env` for the two builders computed from the launch plan)."""

from __future__ import annotations

from ..commands.reference_env import prepare_multi_gpu_env, prepare_simple_launcher_cmd_env
from ..launch.env import *  # noqa: F403 - the whole public surface of the home module
from ..launch.env import __all__ as _home_names

__all__ = [*_home_names, "prepare_multi_gpu_env", "prepare_simple_launcher_cmd_env"]
