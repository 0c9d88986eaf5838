"""The `Accelerator` and the components it owns (settings, preparation, accumulation).

`cadence.accelerator.Accelerator` is the reference's module path for the class.
"""

from .facade import Accelerator

__all__ = ["Accelerator"]
