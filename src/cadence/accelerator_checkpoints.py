"""The Accelerator's checkpoint methods (a mixin of Accelerator): save_state, load_state, save, ..."""

from __future__ import annotations

import os
from typing import Any

import torch


class CheckpointMethods:
    """save_state / load_state / hooks / save / save_model, delegating to cadence.checkpoint_flow."""

    # -- checkpoints ------------------------------------------------------------------------------------
    def save_state(
        self,
        output_dir: str | os.PathLike | None = None,
        safe_serialization: bool = True,
        **save_model_func_kwargs: Any,
    ) -> str:
        """Save models, optimizers, schedulers, scaler, RNG states, dataloader positions and registered
        objects into one atomically committed folder; returns its path.

        With ProjectConfiguration(automatic_checkpoint_naming=True) the folder is
        `project_dir/checkpoints/checkpoint_<i>` and `total_limit` keeps the newest ones. Pass
        `async_save=True` to write in the background (the next save, load or end_training waits).
        """
        from .checkpoint_flow import save_state

        return save_state(self, output_dir, safe_serialization, **save_model_func_kwargs)

    def load_state(
        self,
        input_dir: str | os.PathLike | None = None,
        load_kwargs: dict | None = None,
        **load_model_func_kwargs: Any,
    ) -> None:
        """Restore everything save_state wrote, after verifying the whole checkpoint (the newest complete
        one when `input_dir` is None). Files holding pickles load only with `allow_pickle=True`."""
        from .checkpoint_flow import load_state

        load_state(self, input_dir, load_kwargs, **load_model_func_kwargs)

    def register_for_checkpointing(self, *objects: Any) -> None:
        """Save and load these objects (anything with state_dict / load_state_dict) with the state."""
        from .checkpoint_flow import check_checkpointable

        check_checkpointable(objects)
        self._custom_objects.extend(objects)

    def register_save_state_pre_hook(self, hook: Any) -> Any:
        """`hook(models, weights, output_dir)` runs before save_state writes; returns a removable handle."""
        return self._register_hook(self._save_model_state_pre_hook, hook)

    def register_load_state_pre_hook(self, hook: Any) -> Any:
        """`hook(models, input_dir)` runs before load_state loads; returns a removable handle."""
        return self._register_hook(self._load_model_state_pre_hook, hook)

    @staticmethod
    def _register_hook(hooks: dict, hook: Any) -> Any:
        from torch.utils.hooks import RemovableHandle

        if not callable(hook):
            raise TypeError(f"A state hook must be callable, got {type(hook).__name__}.")
        handle = RemovableHandle(hooks)
        hooks[handle.id] = hook
        return handle

    def save(self, obj: Any, f: Any, safe_serialization: bool = False) -> None:
        """`torch.save` (or safetensors) on the main process only, or once per machine with save_on_each_node."""
        from .checkpointing import save

        if self.project_configuration.save_on_each_node:
            should_write = self.is_local_main_process
        else:
            should_write = self.is_main_process
        if should_write:
            save(obj, f, safe_serialization=safe_serialization)

    def save_model(
        self,
        model: torch.nn.Module,
        save_directory: str | os.PathLike,
        max_shard_size: int | str = "10GB",
        safe_serialization: bool = True,
    ) -> None:
        """Write the model's weights as (sharded) safetensors with an index, for load_checkpoint_in_model."""
        from .checkpointing import parse_shard_size, save_model

        parse_shard_size(
            max_shard_size
        )  # on every rank, so no rank waits for a failed main process
        if os.path.isfile(save_directory):
            # The reference logs this and returns rather than raising.
            import logging

            logging.getLogger(__name__).error(
                "save_model: %s should be a directory, not a file; nothing was saved.",
                save_directory,
            )
            return
        state_dict = self.get_state_dict(model)
        if self.is_main_process:
            save_model(
                state_dict,
                save_directory,
                max_shard_size=max_shard_size,
                safe_serialization=safe_serialization,
            )
        self.wait_for_everyone()
