"""GradientState: whether gradients synchronise this step, and where the active dataloader stands.

One state per process, shared by every instance (Accelerate's semantics); `cadence.state` re-exports
it. Objects that need it (optimizer, scheduler, loaders) receive it at construction.
"""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..options.dataclasses import GradientAccumulationPlugin


class GradientState:
    """Whether this micro-step synchronises gradients, and where the active prepared dataloader stands.

    Every instance in a process shares one state. The Accelerator and prepared dataloaders update it;
    training code, schedulers and metrics read it (`sync_gradients`, `end_of_dataloader`, `remainder`).

    Args:
        gradient_accumulation_plugin (GradientAccumulationPlugin | None): Accumulation settings to
            record (number of steps, syncing with the dataloader, syncing each batch); None keeps the
            ones already recorded (one step by default).

    Example:
        >>> from cadence.state import GradientState
        >>> from cadence.utils import GradientAccumulationPlugin
        >>> state = GradientState(GradientAccumulationPlugin(num_steps=4))
        >>> state.num_steps, state.sync_gradients
        (4, True)
    """

    _shared_state: dict[str, Any] = {}

    def __init__(
        self, gradient_accumulation_plugin: GradientAccumulationPlugin | None = None
    ) -> None:
        self.__dict__ = self._shared_state
        if not self.initialized:
            self.sync_gradients = True
            self._dataloader_refs: list[Any] = [None]  # weak: a dropped dataloader must be freed
            self.plugin_kwargs: dict[str, Any] = {}
            self.is_xla_gradients_synced = False
            self._accumulated_micro_steps = 0
        if gradient_accumulation_plugin is not None:
            self.plugin_kwargs = gradient_accumulation_plugin.to_kwargs()

    @property
    def initialized(self) -> bool:
        """Whether the shared gradient state has been set up in this process."""
        return self._shared_state != {}

    @property
    def num_steps(self) -> int:
        """Number of batches accumulated per optimizer step (1 when not accumulating)."""
        return self.plugin_kwargs.get("num_steps", 1)

    @property
    def adjust_scheduler(self) -> bool:
        """Whether the scheduler counts the accumulation steps that do not step the optimizer."""
        return self.plugin_kwargs.get("adjust_scheduler", False)

    @property
    def sync_with_dataloader(self) -> bool:
        """Whether gradients also sync at the end of the dataloader."""
        return self.plugin_kwargs.get("sync_with_dataloader", True)

    @property
    def sync_each_batch(self) -> bool:
        """Whether gradients sync on every batch even while accumulating."""
        return self.plugin_kwargs.get("sync_each_batch", False)

    @property
    def adjust_last_window(self) -> bool:
        """Whether a dataloader's last, shorter accumulation window is reweighted (Cadence's default)."""
        return self.plugin_kwargs.get("adjust_last_window", True)

    @property
    def end_of_dataloader(self) -> bool:
        """Whether the active dataloader has yielded its last batch."""
        return bool(getattr(self.active_dataloader, "end_of_dataloader", False))

    @property
    def remainder(self) -> int:
        """Samples added to even out the last batch of the active dataloader (-1 if unknown)."""
        if self.active_dataloader is None:
            return -1
        return getattr(self.active_dataloader, "remainder", -1)

    @property
    def in_dataloader(self) -> bool:
        """Whether a prepared dataloader is being iterated right now."""
        return self.active_dataloader is not None

    def _set_sync_gradients(self, sync_gradients: bool) -> None:
        self.sync_gradients = sync_gradients

    @property
    def window_factor(self) -> float:
        """What the optimizer step multiplies the gradients by (Cadence only): `num_steps / micro-steps`
        while a dataloader's last, shorter accumulation window closes (`adjust_last_window`), else 1."""
        return self.__dict__.get("_window_factor", 1.0)

    def _set_window_factor(self, factor: float) -> None:
        self._window_factor = factor

    def __getstate__(self) -> dict[str, Any]:
        # Dataloaders are held weakly and weak references do not pickle: a copy is outside any loop.
        state = dict(self.__dict__)
        state["_dataloader_refs"] = [None]
        return state

    @property
    def dataloader_references(self) -> list[Any]:
        """The dataloaders being iterated, latest last (None for ones garbage-collected)."""
        return [None if ref is None else ref() for ref in self._dataloader_refs]

    @property
    def active_dataloader(self) -> Any:
        """The dataloader being iterated now (the latest one registered)."""
        return self.dataloader_references[-1]

    def _add_dataloader(self, dataloader: Any) -> None:
        self._dataloader_refs.append(weakref.ref(dataloader))

    def _remove_dataloader(self, dataloader: Any) -> None:
        self._dataloader_refs = [
            ref for ref in self._dataloader_refs if ref is None or ref() not in (None, dataloader)
        ]

    def __repr__(self) -> str:
        return (
            f"Sync Gradients: {self.sync_gradients}\n"
            f"At end of current dataloader: {self.end_of_dataloader}\n"
            f"Extra samples added: {self.remainder}\n"
            f"Gradient accumulation plugin: {self.plugin_kwargs}\n"
        )

    @classmethod
    def _reset_state(cls) -> None:
        cls._shared_state.clear()
