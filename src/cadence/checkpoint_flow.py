"""save_state / load_state of the Accelerator: what goes into a checkpoint folder and in which order.

Storage rules (temporary sibling folder, fsync, manifest last, atomic rename, rotation only after the
commit) live in `cadence.checkpointing`; this module decides what each process writes, places the
barriers and, when loading, reads and verifies everything before changing any object.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import Any

from .checkpointing import (
    AsyncCheckpointSaver,
    CheckpointError,
    begin_checkpoint,
    capture_rng_state,
    checkpoints_dir,
    cleanup_checkpoints_dir,
    commit_checkpoint,
    latest_checkpoint,
    new_token,
    next_iteration,
    prune_checkpoints,
    write_and_commit,
    write_rank_files,
)
from .checkpointing.fs import wait_for_removals
from .checkpointing.layout import (
    custom_state_file,
    model_file,
    optimizer_file,
    rng_state_file,
    scaler_file,
    scheduler_file,
)
from .checkpointing.state_io import (
    StateTargets,
    apply_training_state,
    dataloader_rank_file,
    read_training_state,
)
from .collectives import broadcast_object_list, gather_object


def _resolve_save_dir(accelerator: Any, output_dir: Any) -> Path:
    config = accelerator.project_configuration
    if config.automatic_checkpoint_naming:
        if accelerator.project_dir is None:
            raise ValueError(
                "automatic_checkpoint_naming needs a project directory: pass project_dir= to the "
                "Accelerator or ProjectConfiguration."
            )
        final = checkpoints_dir(accelerator.project_dir) / f"checkpoint_{config.iteration}"
        if final.exists():
            raise ValueError(
                f"Checkpoint directory {final} ({config.iteration}) already exists. Resume with "
                "load_state() (which continues the numbering), or set "
                "accelerator.project_configuration.iteration to the next free number."
            )
        return final
    if config.total_limit is not None:
        raise ValueError(
            "ProjectConfiguration(total_limit=...) only applies to automatically named checkpoints: "
            "also pass automatic_checkpoint_naming=True (checkpoints then go to "
            "<project_dir>/checkpoints/checkpoint_<i>), or drop total_limit."
        )
    if output_dir is None:
        raise ValueError(
            "save_state() needs an output_dir, or ProjectConfiguration(automatic_checkpoint_naming=True) "
            "with a project_dir."
        )
    return Path(os.path.expanduser(os.fspath(output_dir)))


def _shared_token(accelerator: Any) -> str:
    token = [new_token() if accelerator.is_main_process else None]
    return broadcast_object_list(token)[0]


def _gather_files(accelerator: Any, safe_serialization: bool, output_dir: str) -> dict[str, Any]:
    """Every file this process writes: name -> state (tensors and plain values)."""
    strategy = accelerator._strategy
    rank = accelerator.process_index
    main = accelerator.is_main_process
    files: dict[str, Any] = {}
    weights = (
        []
        if strategy.saves_sharded_state
        else [accelerator.get_state_dict(m) for m in accelerator._models]
    )
    for hook in list(accelerator._save_model_state_pre_hook.values()):
        hook(accelerator._models, weights, output_dir)
    if main:
        for i, state in enumerate(weights):
            files[model_file(i, safe_serialization)] = (
                "weights" if safe_serialization else "object",
                state,
            )
        if not strategy.saves_sharded_state:
            for i, optimizer in enumerate(accelerator._optimizers):
                files[optimizer_file(i)] = ("object", optimizer.state_dict())
        for i, scheduler in enumerate(accelerator._schedulers):
            files[scheduler_file(i)] = ("object", scheduler.state_dict())
        if accelerator.scaler is not None:
            files[scaler_file()] = ("object", accelerator.scaler.state_dict())
        for i, obj in enumerate(accelerator._custom_objects):
            files[custom_state_file(i)] = ("object", obj.state_dict())
    for i, loader in enumerate(accelerator._dataloaders):
        if hasattr(loader, "state_dict"):
            files[dataloader_rank_file(i, rank)] = ("object", loader.state_dict())
    files[rng_state_file(rank)] = ("object", capture_rng_state(step=accelerator.step))
    return files


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


def save_state(
    accelerator: Any, output_dir: Any = None, safe_serialization: bool = True, **kwargs: Any
) -> str:
    async_save = bool(kwargs.pop("async_save", False))
    final = _resolve_save_dir(accelerator, output_dir)
    wait_for_async_save(accelerator)
    config = accelerator.project_configuration
    rank, world = accelerator.process_index, accelerator.num_processes
    main = accelerator.is_main_process
    if config.automatic_checkpoint_naming and main and final.parent.is_dir():
        cleanup_checkpoints_dir(final.parent)  # leftovers of saves killed earlier
    writer = begin_checkpoint(final, token=_shared_token(accelerator), rank=rank)
    try:
        if accelerator._strategy.saves_sharded_state:
            accelerator._strategy.save_sharded_state(
                writer.tmp_dir, accelerator._models, accelerator._optimizers
            )
        files = _gather_files(accelerator, safe_serialization, str(writer.tmp_dir))
    except BaseException:
        writer.abort()
        raise
    metadata = {"cadence_files_by": "save_state", "step": accelerator.step}
    # total_limit=0 keeps only the checkpoint just written, as in the reference.
    limit = (
        max(config.total_limit, 1)
        if config.automatic_checkpoint_naming and config.total_limit is not None
        else None
    )

    def rotate() -> None:
        if limit is not None:
            prune_checkpoints(final.parent, limit, background=True)

    if async_save:
        saver = accelerator.__dict__.setdefault("_async_saver", AsyncCheckpointSaver())
        # Blocks only for the copy to CPU memory; no collective runs in the background: the
        # committing rank waits for the others' markers (or their failure markers).
        saver.submit(
            write_and_commit,
            writer,
            saver.snapshot(files),
            commit=main,
            world_size=world,
            timeout=600,
            metadata=metadata,
            after_commit=rotate,
            remove_old_in_background=True,
        )
    else:
        # Two collectives, each also carrying every rank's outcome, so a rank that fails (a full
        # disk) makes every rank fail together instead of leaving the others in a barrier.
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
                metadata=metadata,
                after_commit=rotate,
                remove_old_in_background=True,
            )
            if error is not None:
                writer.abort()
        outcome = broadcast_object_list([_failure(error, rank) if main else None])
        _raise_agreed(outcome, error if main else None)
    if config.automatic_checkpoint_naming:
        config.iteration += 1
    return str(final)


def wait_for_async_save(accelerator: Any) -> None:
    """Block until this process's asynchronous save (if any) is committed; raise its error."""
    saver = accelerator.__dict__.get("_async_saver")
    if saver is not None:
        # One collective that also carries each rank's outcome: when the save failed anywhere
        # (a full disk on the rank that writes the model), every rank raises, none waits.
        error = _attempt(saver.wait)
        _raise_agreed(gather_object([_failure(error, accelerator.process_index)]), error)
    wait_for_removals()


def _resolve_load_dir(accelerator: Any, input_dir: Any) -> tuple[Path, bool]:
    if input_dir is not None:
        return Path(os.path.expanduser(os.fspath(input_dir))), False
    if not accelerator.project_configuration.automatic_checkpoint_naming:
        raise ValueError("No input_dir provided and automatic checkpoint naming is disabled.")
    directory = checkpoints_dir(accelerator.project_dir)
    newest = latest_checkpoint(directory) if directory.is_dir() else None
    if newest is None:
        raise FileNotFoundError(
            f"No complete checkpoint in {directory} to resume from (incomplete ones are ignored). "
            "Call save_state() first, or pass input_dir=."
        )
    return newest, True


def load_state(
    accelerator: Any, input_dir: Any = None, load_kwargs: dict | None = None, **model_kwargs: Any
) -> None:
    wait_for_async_save(accelerator)
    allow_pickle = bool(model_kwargs.pop("allow_pickle", False))
    if (load_kwargs or {}).get("weights_only") is False:
        allow_pickle = True  # what the refusal message and the reference suggest
    model_kwargs.pop("map_location", None)  # states are read to CPU, then moved by their owners
    strict = model_kwargs.pop("strict", True)
    path, automatic = _resolve_load_dir(accelerator, input_dir)
    strategy = accelerator._strategy
    rank = accelerator.process_index
    models = list(accelerator._models)
    for hook in list(accelerator._load_model_state_pre_hook.values()):
        hook(models, str(path))
    targets = StateTargets(
        models={
            i: accelerator.unwrap_model(model)
            for i, model in enumerate(accelerator._models)
            if any(model is m for m in models)
        },
        optimizers=list(accelerator._optimizers),
        schedulers=list(accelerator._schedulers),
        scaler=accelerator.scaler,
        customs=list(accelerator._custom_objects),
        loaders={
            i: loader
            for i, loader in enumerate(accelerator._dataloaders)
            if hasattr(loader, "load_state_dict")
        },
        rank=rank,
        strict=strict,
        sharded=strategy.saves_sharded_state,
    )
    # Read and verify everything, check every state fits, then apply all or nothing.
    loaded = read_training_state(path, targets, allow_pickle=allow_pickle)
    apply_training_state(path, targets, loaded)
    if loaded.rng is not None:
        accelerator.step = int(loaded.rng.get("step", accelerator.step))
    if strategy.saves_sharded_state:
        strategy.load_sharded_state(path, accelerator._models, accelerator._optimizers)
    if loaded.rng is None:
        warnings.warn(
            f"{path} holds no RNG state for process {rank} (saved with fewer processes?): random "
            "numbers will not continue where the saved run left them.",
            UserWarning,
            stacklevel=3,
        )
    if automatic:
        accelerator.project_configuration.iteration = next_iteration(path.parent)


class NotCheckpointableError(TypeError, ValueError):
    """An object given to register_for_checkpointing lacks state_dict / load_state_dict (the reference
    raises ValueError; TypeError describes it better, so it is both)."""


def check_checkpointable(objects: tuple[Any, ...]) -> None:
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


__all__ = [
    "CheckpointError",
    "check_checkpointable",
    "load_state",
    "save_state",
    "wait_for_async_save",
]
