"""Accelerate's `utils.fsdp_utils` path (home: `cadence.fsdp_helpers`, whose public names, its
`__all__`, are the ones re-exported here)."""

from __future__ import annotations

from ..fsdp_helpers import *  # noqa: F403 - the home's list of names is the one list
from ..fsdp_helpers import __all__ as __all__
