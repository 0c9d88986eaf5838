"""The Checkpointer: save_state / load_state of one Accelerator, what goes into a checkpoint folder
and in which order.

Storage rules (temporary sibling folder, fsync, manifest last, atomic rename, rotation only after the
commit) live in the storage modules of this package; the Checkpointer decides what each process
writes, exchanges every rank's outcome (so all fail together) and, when loading, reads and verifies
everything before changing any object. It is built once by the Accelerator and given what it uses.
"""

from __future__ import annotations

import logging
import os
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..core.prepared import PreparedObjects
from ..core.settings import env_bool
from ..diagnostics.stop_notice import say_resumed
from ..options.dataclasses import ProjectConfiguration
from ..runtime.collectives import gather_object
from ..strategies import Strategy
from .atomic import begin_checkpoint, new_token
from .engine_files import verify_engine_files
from .errors import CheckpointError, CheckpointMismatchError, NoCheckpointError
from .fs import wait_for_removals
from .generation import fence
from .layout import (
    custom_state_file,
    model_file,
    optimizer_file,
    rng_state_file,
    scaler_file,
    scheduler_file,
)
from .reader import open_checkpoint
from .rotation import (
    checkpoints_dir,
    cleanup_checkpoints_dir,
    latest_checkpoint,
    next_iteration,
    prune_checkpoints,
)
from .serialization import capture_rng_state, save
from .state_fit import loader_checkpoint_state
from .state_io import (
    StateTargets,
    apply_training_state,
    dataloader_rank_file,
    read_training_state,
)

if TYPE_CHECKING:
    from .async_writer import AsyncCheckpointSaver


def _failure(error: BaseException | None, rank: int) -> dict | None:
    if error is None:
        return None
    return {
        "rank": rank,
        "errno": getattr(error, "errno", None),
        "type": type(error).__name__,
        "message": str(error)[:2000],
    }


def _raise_agreed(failures: list, own: BaseException | None) -> None:
    """Raise on every rank when any rank failed: its own error, or the first failed rank's cause."""
    failed = [f for f in failures if f]
    if not failed:
        return
    if own is not None:
        raise own
    first = failed[0]
    message = f"save_state failed on rank {first['rank']}: {first['message']}"
    if isinstance(first["errno"], int):
        raise OSError(first["errno"], message)
    raise CheckpointError(message)


def _attempt(fn: Any, *args: Any, **kwargs: Any) -> BaseException | None:
    try:
        fn(*args, **kwargs)
    except Exception as e:  # reported to every rank before anyone raises
        return e
    return None


class Checkpointer:
    """save_state / load_state / save / save_model of one Accelerator.

    Built once by the Accelerator with what it uses: the strategy (which saves sharded state and owns
    the scaler), the record of prepared objects, the project configuration, this process's rank, the
    world size, a barrier, and the accumulation step counter (read and restored with the RNG state).

    Example::

        checkpointer = Checkpointer(strategy, prepared, project_config, process_index=0,
                                    local_process_index=0, num_processes=1,
                                    wait_for_everyone=lambda: None,
                                    get_step=lambda: 0, set_step=lambda step: None)
        checkpointer.save_state("ckpt")
    """

    def __init__(
        self,
        strategy: Strategy,
        prepared: PreparedObjects,
        project_config: ProjectConfiguration,
        *,
        process_index: int,
        local_process_index: int,
        num_processes: int,
        wait_for_everyone: Callable[[], None],
        get_step: Callable[[], int],
        set_step: Callable[[int], None],
        state_dict: Callable[[Any], dict[str, Any]] | None = None,
    ) -> None:
        self.strategy = strategy
        self.prepared = prepared
        self.project_config = project_config
        self.process_index = process_index
        self.local_process_index = local_process_index
        self.num_processes = num_processes
        self.wait_for_everyone = wait_for_everyone
        self.get_step = get_step
        self.set_step = set_step
        # How a model's whole state dict is taken (the Accelerator's get_state_dict by default).
        self.state_dict = state_dict or strategy.state_dict
        self._async_saver: AsyncCheckpointSaver | None = None
        self._claimed_project_dir = False

    @property
    def is_main_process(self) -> bool:
        """Whether this is global rank 0 (which writes the shared files)."""
        return self.process_index == 0

    # -- save_state ---------------------------------------------------------------------------------
    def _claim_project_dir(self) -> None:
        """Before the first automatically named save: a second live job saving into the same
        project_dir would overwrite this one's checkpoints, so it is refused on every rank (a
        collective, on the first save only) before anything is written."""
        config = self.project_config
        if self._claimed_project_dir or not config.automatic_checkpoint_naming:
            return
        if config.project_dir is None:
            return  # _resolve_save_dir says what is missing
        from .writer_lock import claim_project_dir  # deferred: not on the resume path

        claim_project_dir(
            config.project_dir,
            is_main=self.is_main_process,
            rank=self.process_index,
            agree=gather_object,
        )
        self._claimed_project_dir = True

    def _resolve_save_dir(self, output_dir: Any) -> Path:
        config = self.project_config
        if config.automatic_checkpoint_naming:
            if config.project_dir is None:
                raise ValueError(
                    "automatic_checkpoint_naming needs a project directory: pass project_dir= to the "
                    "Accelerator or ProjectConfiguration."
                )
            final = checkpoints_dir(config.project_dir) / f"checkpoint_{config.iteration}"
            fence(
                final.parent, "write"
            )  # a superseded worker exits here (checkpointing/generation)
            if final.exists():
                raise ValueError(
                    f"Checkpoint directory {final} ({config.iteration}) already exists. Resume with "
                    "load_state() (which continues the numbering), or set "
                    "accelerator.project_configuration.iteration to the next free number."
                )
            return final
        if config.total_limit is not None:
            raise ValueError(
                "ProjectConfiguration(total_limit=...) only applies to automatically named "
                "checkpoints: also pass automatic_checkpoint_naming=True (checkpoints then go to "
                "<project_dir>/checkpoints/checkpoint_<i>), or drop total_limit."
            )
        if output_dir is None:
            raise ValueError(
                "save_state() needs an output_dir, or ProjectConfiguration("
                "automatic_checkpoint_naming=True) with a project_dir."
            )
        return Path(os.path.expanduser(os.fspath(output_dir)))

    def _folder_plan(self, final: Path) -> tuple[str, list[int]]:
        """The save's shared token (made by rank 0) and the ranks saving into this process's folder.

        Processes may be given different folders (each its own temporary directory, as Ray Train's
        guide does): each folder is then committed by the lowest rank that named it and holds what
        its ranks own (the main process's folder the replicated states, every rank's its RNG state
        and position), each with its own per-rank manifest, so that a plain union of the folders is
        the whole checkpoint.
        """
        mine = (new_token() if self.is_main_process else None, str(final.absolute()))
        entries = gather_object([mine])
        ranks = [r for r, (_, folder) in enumerate(entries) if folder == mine[1]]
        return entries[0][0], ranks

    def _gather_files(
        self, safe_serialization: bool, output_dir: str, writes_shared: bool
    ) -> dict[str, Any]:
        """Every file this process writes: name -> state (tensors and plain values).

        `writes_shared`: this process also writes the files every rank holds alike (weights,
        optimizers, schedulers, scaler, registered objects): the main process only, whichever
        folder it saves into (every other rank writes only what is its own).
        """
        prepared, strategy = self.prepared, self.strategy
        rank = self.process_index
        files: dict[str, Any] = {}
        sharded = strategy.saves_sharded_state
        weights = [] if sharded else [self.state_dict(m) for m in prepared.models]
        for hook in list(prepared.save_state_pre_hooks.values()):
            hook(prepared.models, weights, output_dir)
        if writes_shared:
            for i, state in enumerate(weights):
                kind = "weights" if safe_serialization else "object"
                files[model_file(i, safe_serialization)] = (kind, state)
            if not sharded:
                for i, optimizer in enumerate(prepared.optimizers):
                    files[optimizer_file(i)] = ("object", optimizer.state_dict())
            for i, scheduler in enumerate(prepared.schedulers):
                files[scheduler_file(i)] = ("object", scheduler.state_dict())
            scaler = strategy.precision.scaler
            if scaler is not None:
                files[scaler_file()] = ("object", scaler.state_dict())
            for i, obj in enumerate(prepared.custom_objects):
                files[custom_state_file(i)] = ("object", obj.state_dict())
        for i, loader in enumerate(prepared.dataloaders):
            if hasattr(loader, "state_dict"):
                files[dataloader_rank_file(i, rank)] = ("object", loader_checkpoint_state(loader))
        files[rng_state_file(rank)] = ("object", capture_rng_state(step=self.get_step()))
        return files

    def save_state(
        self,
        output_dir: Any = None,
        safe_serialization: bool = True,
        writes: bool = True,
        **kwargs: Any,
    ) -> str:
        """Write everything into one atomically committed folder; returns its path (collective).

        `writes=False` (a replica group that leaves the writing to another) writes nothing and
        returns the folder the writing group uses, counting it as saved.
        """
        from .async_writer import (  # deferred: a resume never imports the writing side
            AsyncCheckpointSaver,
            commit_checkpoint,
            write_and_commit,
            write_rank_files,
        )

        async_save = bool(kwargs.pop("async_save", False))
        if not writes:
            config = self.project_config
            if not config.automatic_checkpoint_naming:
                return str(self._resolve_save_dir(output_dir))
            # The writing group may have committed it already: named here, not checked.
            final = checkpoints_dir(config.project_dir) / f"checkpoint_{config.iteration}"
            config.iteration += 1
            return str(final)
        self._claim_project_dir()
        final = self._resolve_save_dir(output_dir)
        self.wait_for_async_save()
        config = self.project_config
        rank, world = self.process_index, self.num_processes
        if config.automatic_checkpoint_naming and self.is_main_process and final.parent.is_dir():
            cleanup_checkpoints_dir(final.parent)  # leftovers of saves killed earlier
            if config.total_limit is not None:
                # A save killed between its commit and its pruning left one checkpoint too many:
                # prune before writing, so a kill never leaves more than total_limit + 1.
                prune_checkpoints(final.parent, max(config.total_limit, 1), background=False)
        # A collective: also keeps the others from starting their folders before that cleanup.
        token, folder_ranks = self._folder_plan(final)
        main = rank == folder_ranks[0]  # this folder's committer
        writer = begin_checkpoint(final, token=token, rank=rank, committer=main)
        try:
            if self.strategy.saves_sharded_state:
                self.strategy.save_sharded_state(
                    writer.tmp_dir, self.prepared.models, self.prepared.optimizers
                )
            files = self._gather_files(
                safe_serialization, str(writer.tmp_dir), writes_shared=self.is_main_process
            )
        except BaseException:
            writer.abort()
            raise
        # "save" ties the parts of one save together when per-worker folders are merged.
        metadata = {"cadence_files_by": "save_state", "step": self.get_step(), "save": token}
        # total_limit=0 keeps only the checkpoint just written, as in the reference.
        limit = (
            max(config.total_limit, 1)
            if config.automatic_checkpoint_naming and config.total_limit is not None
            else None
        )

        def rotate() -> None:
            if limit is not None:
                # Synchronously: a process killed right after the commit must not leave more than
                # total_limit + 1 complete checkpoints behind.
                prune_checkpoints(final.parent, limit, background=False)

        if async_save:
            saver = self._async_saver = self._async_saver or AsyncCheckpointSaver()
            # Blocks only for the copy to CPU memory; no collective runs in the background: the
            # committing rank waits for the others' markers (or their failure markers).
            saver.submit(
                write_and_commit,
                writer,
                saver.snapshot(files),
                commit=main,
                world_size=world,
                ranks=folder_ranks,
                timeout=600,
                metadata=metadata,
                after_commit=rotate,
                remove_old_in_background=True,
            )
        else:
            # Two collectives, each also carrying every rank's outcome, so a rank that fails (a
            # full disk) makes every rank fail together instead of leaving the others in a barrier.
            error = _attempt(write_rank_files, writer, files)
            failures = gather_object([_failure(error, rank)])
            if any(failures):
                writer.abort()
                _raise_agreed(failures, error)
            if main:
                error = _attempt(
                    commit_checkpoint,
                    writer,
                    world_size=world,
                    ranks=folder_ranks,
                    metadata=metadata,
                    after_commit=rotate,
                    remove_old_in_background=True,
                )
                if error is not None:
                    writer.abort()
            # Every committer's outcome reaches every rank (one committer per folder).
            outcome = gather_object([_failure(error, rank) if main else None])
            _raise_agreed(outcome, error if main else None)
        if config.automatic_checkpoint_naming:
            config.iteration += 1
        return str(final)

    def wait_for_async_save(self) -> None:
        """Block until this process's asynchronous save (if any) is committed; raise its error."""
        saver = self._async_saver
        if saver is not None:
            # One collective that also carries each rank's outcome: when the save failed anywhere
            # (a full disk on the rank that writes the model), every rank raises, none waits.
            error = _attempt(saver.wait)
            _raise_agreed(gather_object([_failure(error, self.process_index)]), error)
        wait_for_removals()

    # -- load_state ---------------------------------------------------------------------------------
    def _resolve_load_dir(self, input_dir: Any) -> tuple[Path, bool]:
        if input_dir is not None:
            return Path(os.path.expanduser(os.fspath(input_dir))), False
        if not self.project_config.automatic_checkpoint_naming:
            raise ValueError("No input_dir provided and automatic checkpoint naming is disabled.")
        directory = checkpoints_dir(self.project_config.project_dir)
        newest = latest_checkpoint(directory) if directory.is_dir() else None
        if newest is None:
            raise NoCheckpointError(
                f"No complete checkpoint in {directory} to resume from (incomplete ones are "
                "ignored). Call save_state() first, or pass input_dir=.",
                path=directory,
            )
        return newest, True

    def load_state(
        self, input_dir: Any = None, load_kwargs: dict | None = None, **model_kwargs: Any
    ) -> None:
        """Verify the whole checkpoint, check every state fits, then apply all of it or nothing."""
        self.wait_for_async_save()
        allow_pickle = bool(model_kwargs.pop("allow_pickle", False))
        # A folder Accelerate wrote has no manifest: refused unless asked for (the error says how).
        allow_unverified = bool(model_kwargs.pop("allow_unverified", False)) or env_bool(
            "CADENCE_LOAD_UNVERIFIED"
        )
        if (load_kwargs or {}).get("weights_only") is False:
            allow_pickle = True  # what the refusal message and the reference suggest
        model_kwargs.pop("map_location", None)  # states are read to CPU, then moved by their owners
        strict = model_kwargs.pop("strict", True)
        path, automatic = self._resolve_load_dir(input_dir)
        prepared, strategy, rank = self.prepared, self.strategy, self.process_index
        models = list(prepared.models)
        for hook in list(prepared.load_state_pre_hooks.values()):
            hook(models, str(path))
        targets = StateTargets(
            models={
                i: strategy.unwrap_fully(model)[0]
                for i, model in enumerate(prepared.models)
                if any(model is m for m in models)
            },
            optimizers=list(prepared.optimizers),
            schedulers=list(prepared.schedulers),
            scaler=strategy.precision.scaler,
            customs=list(prepared.custom_objects),
            loaders={
                i: loader
                for i, loader in enumerate(prepared.dataloaders)
                if hasattr(loader, "load_state_dict")
            },
            rank=rank,
            strict=strict,
            sharded=strategy.saves_sharded_state,
            world_size=self.num_processes,
        )
        # With several processes, those of a machine verify the files they share once, together
        # (node_verify), and all of them refuse a checkpoint any of them found damaged.
        agree = gather_object if self.num_processes > 1 else None
        loaded = read_training_state(
            path, targets, allow_pickle=allow_pickle, agree=agree, allow_unverified=allow_unverified
        )
        saved_world = loaded.saved_world_size
        if strategy.saves_sharded_state and not getattr(strategy, "reshards_on_load", True):
            if saved_world is not None and saved_world != self.num_processes:
                raise CheckpointMismatchError(
                    f"{path} holds {strategy.name} shards of {saved_world} processes; this run has "
                    f"{self.num_processes}. Load it on {saved_world} processes, or convert it "
                    "with DeepSpeed's universal checkpoint (deepspeed.checkpoint.ds_to_universal) "
                    "and load that through DeepSpeed's load_universal_checkpoint setting.",
                    path=path,
                )
        if strategy.saves_sharded_state:
            # The strategy reads its own files after the states below are applied: all of them
            # are checked first, every rank its share (a collective).
            verify_engine_files(path, rank, self.num_processes, gather_object)
        apply_training_state(path, targets, loaded)
        if loaded.rng is not None:
            self.set_step(int(loaded.rng.get("step", self.get_step())))
        if strategy.saves_sharded_state:
            with open_checkpoint(path) as reader:
                strategy.load_sharded_state(
                    path, prepared.models, prepared.optimizers, open_file=reader.open_file
                )
        if loaded.rng is None:
            warnings.warn(
                f"{path} holds no RNG state for process {rank} (it was saved with fewer processes "
                "by an older Cadence): random numbers will not continue where the saved run left them.",
                UserWarning,
                stacklevel=3,
            )
        elif loaded.rng_derived:
            logging.getLogger(__name__).info(
                "Process %d is new since %s was saved: its random generators are seeded from rank "
                "0's saved state and its rank (see the elastic-resume docs).",
                rank,
                path,
            )
        if automatic:
            self.project_config.iteration = next_iteration(path.parent)
        if self.is_main_process:
            say_resumed(path, self.num_processes)  # after an elastic restart: which checkpoint

    # -- registered objects, single objects, whole models ---------------------------------------------
    def register(self, objects: tuple[Any, ...]) -> None:
        """Save and load `objects` (anything with state_dict / load_state_dict) with the state."""
        check_checkpointable(objects)
        self.prepared.custom_objects.extend(objects)

    def save(self, obj: Any, f: Any, safe_serialization: bool = False) -> None:
        """`torch.save` (or safetensors) once: on the main process, or per machine with
        save_on_each_node."""
        if self.project_config.save_on_each_node:
            should_write = self.local_process_index == 0
        else:
            should_write = self.is_main_process
        if should_write:
            save(obj, f, safe_serialization=safe_serialization)

    def save_model(
        self,
        model: Any,
        save_directory: str | os.PathLike,
        max_shard_size: int | str = "10GB",
        safe_serialization: bool = True,
    ) -> None:
        """Write the model's whole weights as (sharded) safetensors with an index (collective)."""
        from .model_io import parse_shard_size, save_model  # deferred: the exporter, when used

        parse_shard_size(
            max_shard_size
        )  # on every rank, so no rank waits for a failed main process
        if os.path.isfile(save_directory):
            # The reference logs this and returns rather than raising.
            logging.getLogger(__name__).error(
                "save_model: %s should be a directory, not a file; nothing was saved.",
                save_directory,
            )
            return
        state_dict = self.state_dict(model)
        if self.is_main_process:
            save_model(
                state_dict,
                save_directory,
                max_shard_size=max_shard_size,
                safe_serialization=safe_serialization,
            )
        self.wait_for_everyone()


class NotCheckpointableError(TypeError, ValueError):
    """An object given to register_for_checkpointing lacks state_dict / load_state_dict (Accelerate
    raises ValueError; TypeError describes it better, so it is both)."""


def check_checkpointable(objects: tuple[Any, ...]) -> None:
    """Refuse objects without state_dict() and load_state_dict(), naming each by its position."""
    invalid = [
        f"\n\t- Item at index {i}, `{type(obj).__name__}`"
        for i, obj in enumerate(objects)
        if not (
            callable(getattr(obj, "state_dict", None))
            and callable(getattr(obj, "load_state_dict", None))
        )
    ]
    if invalid:
        raise NotCheckpointableError(
            "register_for_checkpointing needs objects with state_dict() and load_state_dict() "
            f"functions; these arguments have not:{''.join(invalid)}"
        )


__all__ = ["Checkpointer", "CheckpointError", "NotCheckpointableError", "check_checkpointable"]
