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
    apply_model_state,
    begin_checkpoint,
    capture_rng_state,
    checkpoints_dir,
    cleanup_checkpoints_dir,
    latest_checkpoint,
    new_token,
    next_iteration,
    open_checkpoint,
    prune_checkpoints,
    restore_rng_state,
)
from .checkpointing.layout import (
    custom_state_file,
    dataloader_state_file,
    model_file,
    optimizer_file,
    rng_state_file,
    scaler_file,
    scheduler_file,
)
from .collectives import broadcast_object_list


def dataloader_rank_file(index: int, rank: int) -> str:
    # Positions are per rank: each holds that rank's RNG state at the start of its epoch.
    return dataloader_state_file(index).replace(".bin", f"_rank{rank}.bin")


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


def _write(writer: Any, files: dict[str, Any]) -> None:
    for name, (kind, state) in files.items():
        if kind == "weights":
            writer.save_tensors(name, state, metadata={"format": "pt"})
        else:
            writer.save_object(name, state)


def save_state(
    accelerator: Any, output_dir: Any = None, safe_serialization: bool = True, **kwargs: Any
) -> str:
    async_save = bool(kwargs.pop("async_save", False))
    final = _resolve_save_dir(accelerator, output_dir)
    wait_for_async_save(accelerator)
    config = accelerator.project_configuration
    rank, world = accelerator.process_index, accelerator.num_processes
    if config.automatic_checkpoint_naming and accelerator.is_main_process and final.parent.is_dir():
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
    if async_save:
        saver = accelerator.__dict__.setdefault("_async_saver", AsyncCheckpointSaver())
        snapshot = saver.snapshot(files)
        saver.submit(
            _write_and_commit, writer, snapshot, world, accelerator.is_main_process, metadata, limit
        )
    else:
        _write(writer, files)
        writer.rank_done()
        accelerator.wait_for_everyone()
        if accelerator.is_main_process:
            writer.commit(world_size=world, metadata=metadata)
            if limit is not None:
                prune_checkpoints(final.parent, limit)
        accelerator.wait_for_everyone()
    if config.automatic_checkpoint_naming:
        config.iteration += 1
    return str(final)


def _write_and_commit(
    writer: Any, files: dict[str, Any], world: int, main: bool, metadata: dict, limit: Any
) -> None:
    _write(writer, files)
    writer.rank_done()
    if main:
        # No barrier from a background thread: the commit waits for every rank's marker instead.
        writer.commit(world_size=world, metadata=metadata, timeout=600)
        if limit is not None:
            prune_checkpoints(writer.final_dir.parent, limit)


def wait_for_async_save(accelerator: Any) -> None:
    saver = accelerator.__dict__.get("_async_saver")
    if saver is not None:
        saver.wait()
        accelerator.wait_for_everyone()


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


def _read_object(reader: Any, name: str, allow_pickle: bool, map_location: Any = "cpu") -> Any:
    return reader.load_object(name, map_location=map_location, allow_pickle=allow_pickle)


def load_state(
    accelerator: Any, input_dir: Any = None, load_kwargs: dict | None = None, **model_kwargs: Any
) -> None:
    wait_for_async_save(accelerator)
    allow_pickle = bool(model_kwargs.pop("allow_pickle", False))
    model_kwargs.pop("map_location", None)  # states are read to CPU, then moved by their owners
    strict = model_kwargs.pop("strict", True)
    path, automatic = _resolve_load_dir(accelerator, input_dir)
    reader = open_checkpoint(path, verify="full")
    strategy = accelerator._strategy
    rank = accelerator.process_index
    models = list(accelerator._models)
    for hook in list(accelerator._load_model_state_pre_hook.values()):
        hook(models, str(path))
    # Read everything first: a missing or corrupt file raises before any object changes.
    with reader:
        weights = {}
        if not strategy.saves_sharded_state:
            for i, model in enumerate(accelerator._models):
                if not any(model is m for m in models):
                    continue
                if reader.has(model_file(i, True)):
                    weights[i] = reader.load_tensors(model_file(i, True))
                else:
                    weights[i] = _read_object(reader, model_file(i, False), allow_pickle)
        optimizers = (
            []
            if strategy.saves_sharded_state
            else [
                _read_object(reader, optimizer_file(i), allow_pickle)
                for i in range(len(accelerator._optimizers))
            ]
        )
        schedulers = [
            _read_object(reader, scheduler_file(i), allow_pickle)
            for i in range(len(accelerator._schedulers))
        ]
        scaler = (
            _read_object(reader, scaler_file(), allow_pickle)
            if accelerator.scaler is not None
            else None
        )
        customs = [
            _read_object(reader, custom_state_file(i), allow_pickle)
            for i in range(len(accelerator._custom_objects))
        ]
        loaders = {}
        for i, loader in enumerate(accelerator._dataloaders):
            name = dataloader_rank_file(i, rank)
            if hasattr(loader, "load_state_dict") and reader.has(name):
                loaders[i] = _read_object(reader, name, allow_pickle)
        rng = (
            _read_object(reader, rng_state_file(rank), allow_pickle)
            if reader.has(rng_state_file(rank))
            else None
        )
        reader.finish()
    _apply(accelerator, weights, optimizers, schedulers, scaler, customs, loaders, rng, strict)
    if strategy.saves_sharded_state:
        strategy.load_sharded_state(path, accelerator._models, accelerator._optimizers)
    if rng is None:
        warnings.warn(
            f"{path} holds no RNG state for process {rank} (saved with fewer processes?): random "
            "numbers will not continue where the saved run left them.",
            UserWarning,
            stacklevel=3,
        )
    if automatic:
        accelerator.project_configuration.iteration = next_iteration(path.parent)


def _apply(accelerator, weights, optimizers, schedulers, scaler, customs, loaders, rng, strict):
    for i, state in weights.items():
        target = accelerator.unwrap_model(accelerator._models[i])
        apply_model_state(target, state, strict=strict)  # refills tied weights stored once
    for optimizer, state in zip(accelerator._optimizers, optimizers):
        optimizer.load_state_dict(state)
    for scheduler, state in zip(accelerator._schedulers, schedulers):
        scheduler.load_state_dict(state)
    if scaler is not None:
        accelerator.scaler.load_state_dict(scaler)
    for obj, state in zip(accelerator._custom_objects, customs):
        obj.load_state_dict(state)
    for i, state in loaders.items():
        accelerator._dataloaders[i].load_state_dict(state)
    if rng is not None:
        restore_rng_state(rng)
        accelerator.step = int(rng.get("step", accelerator.step))


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
