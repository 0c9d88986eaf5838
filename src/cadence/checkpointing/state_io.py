"""Loading a training state from a checkpoint folder, all-or-nothing, with explicit arguments.

`read_training_state` reads and verifies every file the targets need (each file checked
completely before any byte of it is deserialized); `apply_training_state` checks that every state
fits its object and only then applies them, restoring the applied ones if one still fails. The
caller (the Accelerator's save/load flow) supplies the objects; nothing here knows the Accelerator.

    targets = StateTargets(models={0: model}, optimizers=[opt], rank=0)
    loaded = read_training_state(path, targets)
    apply_training_state(path, targets, loaded)
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .elastic_state import derive_rng_state, has_global_position
from .errors import CheckpointError, CheckpointIncompleteError, CheckpointMismatchError
from .layout import (
    custom_state_file,
    dataloader_state_file,
    model_file,
    optimizer_file,
    rng_state_file,
    scaler_file,
    scheduler_file,
)
from .node_verify import verify_together
from .reader import CheckpointReader, open_checkpoint
from .serialization import apply_model_state, capture_rng_state, restore_rng_state
from .state_fit import (
    ApplyStep,
    apply_all,
    loader_state_problems,
    model_state_problems,
    optimizer_state_problems,
    raise_if_problems,
    rng_state_problems,
    scheduler_state_problems,
    snapshot_loader,
    snapshot_model,
    snapshot_optimizer,
    snapshot_state_dict,
)


def dataloader_rank_file(index: int, rank: int) -> str:
    """File of dataloader `index`'s position on `rank` (each rank has its own RNG position)."""
    return dataloader_state_file(index).replace(".bin", f"_rank{rank}.bin")


@dataclass
class StateTargets:
    """The objects a checkpoint is loaded into, by their index in the checkpoint's file names.

    models: {index: unwrapped module} (only those to load); loaders: {index: dataloader} (those
    with load_state_dict); `sharded`: models' and optimizers' states are loaded by a strategy.
    """

    models: dict[int, Any] = field(default_factory=dict)
    optimizers: list[Any] = field(default_factory=list)
    schedulers: list[Any] = field(default_factory=list)
    scaler: Any = None
    customs: list[Any] = field(default_factory=list)
    loaders: dict[int, Any] = field(default_factory=dict)
    rank: int = 0
    strict: bool = True
    sharded: bool = False
    world_size: int | None = None  # processes loading now (None: as many as saved)


@dataclass
class LoadedState:
    """Everything read from one checkpoint folder for one process, not applied yet."""

    weights: dict[int, Any] = field(default_factory=dict)
    optimizers: list[Any] = field(default_factory=list)
    schedulers: list[Any] = field(default_factory=list)
    scaler: Any = None
    customs: list[Any] = field(default_factory=list)
    loaders: dict[int, Any] = field(default_factory=dict)
    rng: Any = None
    rng_derived: bool = False  # a rank the checkpoint has no RNG state of (more processes now)
    saved_world_size: int | None = None  # processes that saved (None: no manifest)


def files_to_read(reader: CheckpointReader, targets: StateTargets) -> list[str]:
    """The files of the checkpoint `_read_states` reads for `targets` (the same choices)."""
    names: list[str] = []
    if not targets.sharded:
        for i in targets.models:
            safe = model_file(i, True)
            names.append(safe if reader.has(safe) else model_file(i, False))
        names += [optimizer_file(i) for i in range(len(targets.optimizers))]
    names += [scheduler_file(i) for i in range(len(targets.schedulers))]
    names += [scaler_file()] if targets.scaler is not None else []
    names += [custom_state_file(i) for i in range(len(targets.customs))]
    saved_world = reader.manifest.world_size if reader.manifest is not None else None
    rank, world = targets.rank, targets.world_size
    changed = saved_world is not None and world is not None and world != saved_world
    for i in targets.loaders:
        name = dataloader_rank_file(i, rank)
        names.append(name if not changed or reader.has(name) else dataloader_rank_file(i, 0))
    name = rng_state_file(rank)
    if not reader.has(name) and changed and rank >= saved_world:
        name = rng_state_file(0)
    names.append(name)
    return [n for n in dict.fromkeys(names) if reader.has(n)]


def read_training_state(
    path: str | os.PathLike,
    targets: StateTargets,
    *,
    allow_pickle: bool = False,
    verify: str = "full",
    agree: Callable[[list], list] | None = None,
    allow_unverified: bool = False,
) -> LoadedState:
    """Read every state `targets` need from the checkpoint at `path` (verified, nothing applied).

    agree: with several processes, the gather over the process group (every rank calls this
    together): the ranks of a machine then verify the files they share once, each its share
    (node_verify), and every rank raises when a file failed anywhere.
    allow_unverified: a folder without Cadence's manifest (Accelerate's save_state wrote it) is
    read as it is, with a warning, instead of refused; its files still load only as safely as
    Cadence loads any (weights only, unless `allow_pickle`).

    Raises a CheckpointError subclass for a missing, damaged, hostile or unsafe file.
    """
    if agree is None:
        with open_checkpoint(path, verify=verify, allow_unverified=allow_unverified) as reader:
            return _read_states(path, reader, targets, allow_pickle)
    reader: CheckpointReader | None = None
    try:
        reader = open_checkpoint(path, verify=verify, allow_unverified=allow_unverified)
        names = files_to_read(reader, targets)
    except CheckpointError as failure:  # the others still wait for this rank's word
        verify_together(Path(path), None, targets.rank, agree, failure)
        raise
    if reader.manifest is None:  # a folder Cadence did not write: no checksums to share, but
        # the same exchange, so a rank that could not open its folder stops the others here
        with reader:
            verify_together(Path(path), {}, targets.rank, agree)
            return _read_states(path, reader, targets, allow_pickle)
    with reader:
        reader.verify_together(names, targets.rank, agree)
        loaded = _read_states(path, reader, targets, allow_pickle)
        reader.check_unchanged()
    return loaded


def _read_states(
    path: str | os.PathLike, reader: CheckpointReader, targets: StateTargets, allow_pickle: bool
) -> LoadedState:
    loaded = LoadedState()

    def obj(name: str) -> Any:
        return reader.load_object(name, map_location="cpu", allow_pickle=allow_pickle)

    # Every file's tensors are allocated on this thread, one by one: memory allocated here
    # comes from the allocator's main arena, which holds what earlier tensors freed, where a
    # worker thread's arena (or one whole-file buffer) faults in fresh pages, which cost more
    # than reading and hashing the bytes (measured: most of a 100M-parameter load's CPU on the
    # development VM). Two threads then fill them (piece_read), one file after the other.
    if not targets.sharded:
        for i in targets.models:
            if reader.has(model_file(i, True)):
                loaded.weights[i] = reader.load_tensors(model_file(i, True))
            else:
                loaded.weights[i] = obj(model_file(i, False))
        loaded.optimizers = [obj(optimizer_file(i)) for i in range(len(targets.optimizers))]
    loaded.schedulers = [obj(scheduler_file(i)) for i in range(len(targets.schedulers))]
    loaded.scaler = obj(scaler_file()) if targets.scaler is not None else None
    loaded.customs = [obj(custom_state_file(i)) for i in range(len(targets.customs))]
    saved_world = reader.manifest.world_size if reader.manifest is not None else None
    loaded.saved_world_size = saved_world
    rank, world = targets.rank, targets.world_size
    changed = saved_world is not None and world is not None and world != saved_world
    for i in targets.loaders:
        name = dataloader_rank_file(i, rank)
        if changed and not reader.has(name):
            name = dataloader_rank_file(i, 0)  # the position is global: rank 0's says it
        if reader.has(name):
            loaded.loaders[i] = obj(name)
            if changed and not has_global_position(loaded.loaders[i]):
                raise CheckpointMismatchError(
                    f"{path} was saved on {saved_world} processes by an older Cadence, whose "
                    f"dataloader positions ({name}) count batches per process; it resumes only "
                    f"on {saved_world} processes (this run has {world}).",
                    path=path,
                )
    name = rng_state_file(rank)
    if reader.has(name):
        loaded.rng = obj(name)
    elif changed and rank >= saved_world and reader.has(rng_state_file(0)):
        loaded.rng = derive_rng_state(obj(rng_state_file(0)), rank)
        loaded.rng_derived = True
    elif reader.manifest is not None and rank < reader.manifest.world_size:
        raise CheckpointIncompleteError(
            f"{path} holds no RNG state for rank {rank} ({name} is not part of it), though it "
            f"was saved on {reader.manifest.world_size} processes. When each process saved "
            "into its own folder, copy every folder into one before loading.",
            path=path,
            problems=[f"{name}: missing"],
        )
    return loaded


def training_state_problems(targets: StateTargets, loaded: LoadedState) -> list[str]:
    """Every reason a loaded state does not fit its object (empty when all fit)."""
    problems: list[str] = []
    for i, state in loaded.weights.items():
        problems += model_state_problems(targets.models[i], state, targets.strict, f"model {i}")
    for i, (optimizer, state) in enumerate(zip(targets.optimizers, loaded.optimizers)):
        problems += optimizer_state_problems(optimizer, state, f"optimizer {i}")
    for i, (scheduler, state) in enumerate(zip(targets.schedulers, loaded.schedulers)):
        problems += scheduler_state_problems(scheduler, state, f"scheduler {i}")
    for i, state in loaded.loaders.items():
        problems += loader_state_problems(targets.loaders[i], state, f"dataloader {i}")
    if loaded.scaler is not None and not isinstance(loaded.scaler, dict):
        problems.append("scaler: the saved state is not a dict")
    if loaded.rng is not None:
        problems += rng_state_problems(loaded.rng, f"RNG state of process {targets.rank}")
    return problems


def _rng_step(state: Any) -> ApplyStep:
    def snapshot():
        saved = capture_rng_state()
        return lambda: restore_rng_state(saved)

    return ApplyStep("RNG", lambda: restore_rng_state(state), snapshot)


def _load_step(
    label: str, obj: Any, state: Any, snapshot: Callable[[Any], Any] = snapshot_state_dict
) -> ApplyStep:
    """A step that loads `state` into `obj` through its `load_state_dict`, undone from `snapshot`."""
    return ApplyStep(label, lambda: obj.load_state_dict(state), lambda: snapshot(obj))


def apply_training_state(
    path: str | os.PathLike, targets: StateTargets, loaded: LoadedState
) -> None:
    """Check that every loaded state fits its object, then apply them all or none.

    Raises CheckpointMismatchError (a CheckpointError, ValueError and RuntimeError) before any
    change when a state does not fit; when applying fails anyway, restores what was applied.
    """
    path = Path(path)
    try:
        problems = training_state_problems(targets, loaded)
    except Exception as e:  # a state too malformed to even compare
        problems = [f"a saved state has an unexpected structure ({type(e).__name__}: {e})"]
    raise_if_problems(path, problems)
    steps: list[ApplyStep] = []
    if loaded.rng is not None:
        steps.append(_rng_step(loaded.rng))
    steps += [
        _load_step(f"dataloader {i}", targets.loaders[i], state, snapshot=snapshot_loader)
        for i, state in loaded.loaders.items()
    ]
    steps += [
        _load_step(f"registered object {i}", obj, state)
        for i, (obj, state) in enumerate(zip(targets.customs, loaded.customs))
    ]
    if loaded.scaler is not None:
        steps.append(_load_step("scaler", targets.scaler, loaded.scaler))
    steps += [
        _load_step(f"scheduler {i}", obj, state)
        for i, (obj, state) in enumerate(zip(targets.schedulers, loaded.schedulers))
    ]
    steps += [
        _load_step(f"optimizer {i}", obj, state, snapshot=snapshot_optimizer)
        for i, (obj, state) in enumerate(zip(targets.optimizers, loaded.optimizers))
    ]
    # Models last: a plain module whose weights were checked cannot fail half-way, so it needs no
    # copy, and everything before it can still be restored.
    for i, state in loaded.weights.items():
        model = targets.models[i]
        steps.append(
            ApplyStep(
                f"model {i}",
                lambda m=model, s=state: apply_model_state(m, s, strict=targets.strict),
                lambda m=model: snapshot_model(m),
            )
        )
    apply_all(steps, path)
