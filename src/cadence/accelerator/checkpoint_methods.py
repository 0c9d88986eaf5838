"""The Accelerator's checkpoint methods (save_state, load_state, save_model, ...), forwarding to the
`Checkpointer`, which is built at the first of them so that a script that never saves does not load
checkpoint storage. A base class of `Accelerator`, kept apart so the façade stays one screenful per concern.
"""

from __future__ import annotations

import functools
import os
from typing import TYPE_CHECKING, Any

import torch

from .weak_callback import weakly as _weakly

if TYPE_CHECKING:
    from ..checkpointing.checkpointer import Checkpointer


class CheckpointMethods:
    """Checkpoint methods of the Accelerator; they use its strategy, prepared objects, project
    configuration, ranks and accumulation step."""

    # -- checkpoints (the Checkpointer) -------------------------------------------------------------
    def save_state(
        self,
        output_dir: str | os.PathLike | None = None,
        safe_serialization: bool = True,
        **kwargs: Any,
    ) -> str:
        """Save models, optimizers, schedulers, scaler, RNG states, dataloader positions and registered
        objects into one atomically committed folder; returns its path.

        With ProjectConfiguration(automatic_checkpoint_naming=True) the folder is
        `project_dir/checkpoints/checkpoint_<i>` and `total_limit` keeps the newest ones. Pass
        `async_save=True` to write in the background (the next save, load or end_training waits).
        """
        fault_tolerance = self.__dict__.get("_fault_tolerance")
        # Under fault tolerance every replica group holds the same committed state: one writes it.
        writes = fault_tolerance is None or fault_tolerance.writes_checkpoints()
        return self._checkpointer.save_state(
            output_dir, safe_serialization, writes=writes, **kwargs
        )

    def load_state(
        self,
        input_dir: str | os.PathLike | None = None,
        load_kwargs: dict | None = None,
        **kwargs: Any,
    ) -> None:
        """Restore everything save_state wrote, after verifying the whole checkpoint (the newest complete
        one when `input_dir` is None). Files holding pickles load only with `allow_pickle=True`."""
        self._checkpointer.load_state(input_dir, load_kwargs, **kwargs)

    def register_for_checkpointing(self, *objects: Any) -> None:
        """Save and load these objects (anything with state_dict / load_state_dict) with the state."""
        self._checkpointer.register(objects)

    def register_save_state_pre_hook(self, hook: Any) -> Any:
        """`hook(models, weights, output_dir)` runs before save_state writes; returns a removable handle."""
        return self._prepared.register_hook(self._prepared.save_state_pre_hooks, hook)

    def register_load_state_pre_hook(self, hook: Any) -> Any:
        """`hook(models, input_dir)` runs before load_state loads; returns a removable handle."""
        return self._prepared.register_hook(self._prepared.load_state_pre_hooks, hook)

    def save(self, obj: Any, f: Any, safe_serialization: bool = False) -> None:
        """`torch.save` (or safetensors) on the main process only, or once per machine with save_on_each_node."""
        self._checkpointer.save(obj, f, safe_serialization)

    def save_model(
        self,
        model: torch.nn.Module,
        save_directory: str | os.PathLike,
        max_shard_size: int | str = "10GB",
        safe_serialization: bool = True,
    ) -> None:
        """Write the model's weights as (sharded) safetensors with an index, for load_checkpoint_in_model."""
        self._checkpointer.save_model(model, save_directory, max_shard_size, safe_serialization)

    def _wait_for_async_save(self) -> None:
        """Wait for a pending asynchronous save_state, if a checkpointer was ever built."""
        if "_checkpointer" in self.__dict__:
            self._checkpointer.wait_for_async_save()

    @functools.cached_property
    def _checkpointer(self) -> Checkpointer:
        """The owner of save/load_state, built on first use so that a script that never saves does
        not load checkpoint storage."""
        from ..checkpointing.checkpointer import (  # deferred: checkpoint storage loads on first save/load
            Checkpointer,
        )

        return Checkpointer(
            self._strategy,
            self._prepared,
            self._project_configuration,
            process_index=self.process_index,
            local_process_index=self.local_process_index,
            num_processes=self.num_processes,
            wait_for_everyone=_weakly(self, "wait_for_everyone"),
            get_step=functools.partial(getattr, self._accumulation, "step"),
            set_step=functools.partial(setattr, self._accumulation, "step"),
            state_dict=_weakly(self, "get_state_dict"),
        )
