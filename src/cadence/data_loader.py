"""Reference path: re-exports `cadence.data` under Accelerate's `data_loader` module path."""

from .data import *  # noqa: F403
from .data import __all__  # noqa: F401
