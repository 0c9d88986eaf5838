"""Callbacks that reach the Accelerator through a weak reference.

The parts the Accelerator hands callbacks to (the checkpointer, the trackers, ...) must not keep it
alive: a script that drops its Accelerator frees it at once, as Accelerate's is freed.
"""

from __future__ import annotations

import weakref
from typing import Any


class weakly:  # noqa: N801 (used like a function: `weakly(self, "name")`)
    """A callable giving `owner.name(...)` (or, with `call=False`, `owner.name`) through a weak
    reference: the parts the Accelerator hands these to must not keep it alive, so that it is freed
    as soon as the script drops it (as Accelerate's is, without waiting for the garbage collector).
    A pickled Accelerator takes its callbacks along, pointing at the unpickled copy."""

    def __init__(self, owner: Any, name: str, call: bool = True) -> None:
        self._owner = weakref.ref(owner)
        self._name = name
        self._call = call

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        value = getattr(self._owner(), self._name)
        return value(*args, **kwargs) if self._call else value

    def __getstate__(self) -> dict[str, Any]:
        return {"owner": self._owner(), "name": self._name, "call": self._call}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["owner"], state["name"], state["call"])
