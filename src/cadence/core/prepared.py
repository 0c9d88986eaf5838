"""The record of what one Accelerator prepared: models, optimizers, schedulers, dataloaders, and the
objects and hooks registered for checkpointing.

The Accelerator owns one `PreparedObjects` and hands it to the parts that need it (the strategy, the
checkpointer, the accumulation logic); nothing else keeps prepared objects alive.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any


@dataclass
class PreparedObjects:
    """Everything prepared or registered so far, in the order it came.

    Example::

        prepared = PreparedObjects()
        prepared.models.append(model)
    """

    models: list[Any] = field(default_factory=list)
    optimizers: list[Any] = field(default_factory=list)
    schedulers: list[Any] = field(default_factory=list)
    dataloaders: list[Any] = field(default_factory=list)
    custom_objects: list[Any] = field(default_factory=list)
    save_state_pre_hooks: OrderedDict[int, Any] = field(default_factory=OrderedDict)
    load_state_pre_hooks: OrderedDict[int, Any] = field(default_factory=OrderedDict)

    def clear_training_objects(self) -> None:
        """Forget models, optimizers, schedulers and dataloaders (registered objects and hooks stay)."""
        self.models.clear()
        self.optimizers.clear()
        self.schedulers.clear()
        self.dataloaders.clear()

    @staticmethod
    def register_hook(hooks: OrderedDict[int, Any], hook: Any) -> Any:
        """Add `hook` to `hooks` (one of the state hook tables); returns a removable handle."""
        from torch.utils.hooks import RemovableHandle

        if not callable(hook):
            raise TypeError(f"A state hook must be callable, got {type(hook).__name__}.")
        handle = RemovableHandle(hooks)
        hooks[handle.id] = hook
        return handle

    def find_optimizer(self, optimizer: Any) -> Any:
        """The prepared wrapper of `optimizer` (or `optimizer` itself if it is one), else None."""
        for prepared in self.optimizers:
            if prepared is optimizer or getattr(prepared, "optimizer", None) is optimizer:
                return prepared
        return None
