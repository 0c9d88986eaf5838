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
        """Save everything needed to resume training into one folder; returns the folder's path.

        The folder holds the prepared models, optimizers, schedulers, the fp16 scaler, every process's random
        generators, the position of stateful dataloaders, the accumulation step and the objects given to
        `register_for_checkpointing`. Cadence writes it into a temporary folder and commits it atomically with
        a manifest of checksums, so a run killed mid-save never leaves a half-written checkpoint that
        `load_state` would read. Every process must call it (it is a collective).

        Args:
            output_dir (str | os.PathLike | None): Where to write. With
                `ProjectConfiguration(automatic_checkpoint_naming=True)` it is ignored and the folder is
                `<project_dir>/checkpoints/checkpoint_<n>` (the oldest beyond `total_limit` are removed).
                Without automatic naming it is required.
            safe_serialization (bool): Write model weights as safetensors (default True); False uses
                `torch.save`.
            **kwargs: `async_save=True` writes in the background once the tensors are copied (the next
                `save_state`, `load_state` or `end_training` waits for it). Other keywords go to the
                backend's writer.

        Returns:
            str: The path of the committed checkpoint folder.

        Raises:
            ValueError: No `output_dir` and no automatic naming; automatic naming without a project
                directory, or with a `checkpoint_<n>` folder that already exists; `total_limit` without
                automatic naming.

        Example:
            >>> import torch
            >>> from cadence import Accelerator
            >>> from cadence.utils import ProjectConfiguration
            >>> config = ProjectConfiguration(project_dir="run", automatic_checkpoint_naming=True, total_limit=2)
            >>> accelerator = Accelerator(project_config=config)
            >>> model = torch.nn.Linear(2, 2)
            >>> optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
            >>> model, optimizer = accelerator.prepare(model, optimizer)
            >>> import os; os.path.relpath(accelerator.save_state())
            'run/checkpoints/checkpoint_0'
            >>> accelerator.load_state()  # the newest complete checkpoint
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
        """Restore everything `save_state` wrote, all of it or nothing.

        The whole checkpoint is verified against its manifest, and every state is checked against the object
        it goes into (model keys and shapes, optimizer groups) before any object is changed; a mismatch raises
        an error that names the file and the object. Call it after `prepare()` with the same objects in the
        same order. Every process must call it.

        Args:
            input_dir (str | os.PathLike | None): The checkpoint folder. None, with automatic checkpoint
                naming, loads the newest complete checkpoint of `<project_dir>/checkpoints` and continues its
                numbering.
            load_kwargs (dict | None): Options for reading the files. `{"weights_only": False}` allows files
                that hold pickled Python objects, like `allow_pickle=True`.
            **kwargs: `allow_pickle=True` allows pickled files (refused by default: they can run code when
                loaded); `strict=False` loads model weights that do not match exactly;
                `allow_unverified=True` (or `CADENCE_LOAD_UNVERIFIED=1`) loads a folder without Cadence's
                manifest, such as a checkpoint Accelerate wrote, as it is, with a warning. `map_location`
                is accepted and ignored (states are read to the CPU, then moved where their objects live).

        Raises:
            ValueError: No `input_dir` and automatic naming is off.
            NoCheckpointError: Automatic naming found no complete checkpoint.
            CheckpointError: The checkpoint is incomplete, corrupted, or does not fit the prepared objects
                (or was saved by a different number of processes for a backend that cannot reshard).

        Example:
            >>> import torch
            >>> from cadence import Accelerator
            >>> accelerator = Accelerator()
            >>> model = accelerator.prepare(torch.nn.Linear(2, 2))
            >>> folder = accelerator.save_state("ckpt")
            >>> with torch.no_grad():
            ...     _ = model.weight.zero_()
            >>> accelerator.load_state("ckpt")
            >>> bool(model.weight.abs().sum() > 0)
            True
        """
        self._checkpointer.load_state(input_dir, load_kwargs, **kwargs)

    def register_for_checkpointing(self, *objects: Any) -> None:
        """Save and restore these objects with `save_state` and `load_state`.

        Each object needs `state_dict()` and `load_state_dict()` methods (an EMA copy, a custom sampler, a
        counter of your own). They are restored in the order they were registered.

        Args:
            *objects: The objects.

        Raises:
            NotCheckpointableError: An object without `state_dict` or `load_state_dict` (the message lists
                them by position).

        Example:
            >>> from cadence import Accelerator
            >>> class Counter:
            ...     def __init__(self): self.n = 0
            ...     def state_dict(self): return {"n": self.n}
            ...     def load_state_dict(self, state): self.n = state["n"]
            >>> accelerator = Accelerator()
            >>> counter = Counter()
            >>> accelerator.register_for_checkpointing(counter)
            >>> counter.n = 7
            >>> folder = accelerator.save_state("ckpt")
            >>> counter.n = 0
            >>> accelerator.load_state("ckpt")
            >>> counter.n
            7
        """
        self._checkpointer.register(objects)

    def register_save_state_pre_hook(self, hook: Any) -> Any:
        """Run `hook(models, weights, output_dir)` at the start of each `save_state`.

        `models` are the prepared models, `weights` their state dicts (the hook may change them or remove
        entries), `output_dir` the folder being written.

        Args:
            hook (Callable[[list, list, str], None]): The function.

        Returns:
            torch.utils.hooks.RemovableHandle: Call `.remove()` on it to unregister the hook.
        """
        return self._prepared.register_hook(self._prepared.save_state_pre_hooks, hook)

    def register_load_state_pre_hook(self, hook: Any) -> Any:
        """Run `hook(models, input_dir)` at the start of each `load_state`.

        Args:
            hook (Callable[[list, str], None]): The function; `models` are the prepared models.

        Returns:
            torch.utils.hooks.RemovableHandle: Call `.remove()` on it to unregister the hook.
        """
        return self._prepared.register_hook(self._prepared.load_state_pre_hooks, hook)

    def save(self, obj: Any, f: Any, safe_serialization: bool = False) -> None:
        """Save `obj` to `f` once: on the main process (or once per machine with `save_on_each_node`).

        Use it instead of `torch.save` in a script every process runs.

        Args:
            obj (Any): What to save (a state dict, a tensor, any picklable object).
            f (str | os.PathLike | IO): The file to write.
            safe_serialization (bool): Write with safetensors (a dict of tensors only) instead of
                `torch.save` (default False).
        """
        self._checkpointer.save(obj, f, safe_serialization)

    def save_model(
        self,
        model: torch.nn.Module,
        save_directory: str | os.PathLike,
        max_shard_size: int | str = "10GB",
        safe_serialization: bool = True,
    ) -> None:
        """Write the model's weights for sharing or for `load_checkpoint_and_dispatch`: shards plus an index.

        The weights of the unwrapped model are gathered (from every process for sharded models, so every
        process must call it) and written by the main process into `save_directory`, split into files of at
        most `max_shard_size`, with a JSON index when there are several.

        Args:
            model (torch.nn.Module): A prepared (or plain) model.
            save_directory (str | os.PathLike): The folder to write into (created if needed; a file there
                raises).
            max_shard_size (int | str): The largest size of one file, in bytes or as text ("5GB", "500MB";
                default "10GB").
            safe_serialization (bool): Write `model.safetensors` files (default True); False writes
                `pytorch_model.bin` files with `torch.save`.

        Example:
            >>> import torch
            >>> from cadence import Accelerator
            >>> accelerator = Accelerator()
            >>> model = accelerator.prepare(torch.nn.Linear(2, 2))
            >>> accelerator.save_model(model, "exported")
            >>> import os; os.listdir("exported")
            ['model.safetensors']
        """
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
