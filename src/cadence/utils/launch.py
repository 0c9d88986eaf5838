"""The reference's `utils.launch` path (home: `cadence.launch_env`, whose names it re-exports)."""

from __future__ import annotations

from ..launch_env import *  # noqa: F403 - the whole public surface of the home module
from ..launch_env import __all__ as __all__
