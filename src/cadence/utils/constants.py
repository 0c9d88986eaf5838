"""Accelerate's `utils.constants` path (home: `cadence.constants`, whose names it re-exports)."""

from __future__ import annotations

from ..constants import *  # noqa: F403 - the whole public surface of the home module
from ..constants import __all__ as __all__
