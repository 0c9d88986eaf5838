"""`cadence.data_loader`: the names of the reference library's `data_loader` module (see cadence.data)."""

from .data import *  # noqa: F403
from .data import __all__  # noqa: F401
