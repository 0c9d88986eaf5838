"""Saving and loading the state of sharded models and their optimizers.

Two layouts, chosen by the FSDP plugin's `state_dict_type` (file names as in Accelerate):
- sharded: one `torch.distributed.checkpoint` folder per model (`pytorch_model_fsdp_{i}/`) and per
  optimizer (`optimizer_{i}/`); every rank writes its own shard, and the folders can be loaded by any
  number of processes (or merged with `cadence merge-weights`);
- full: the main process writes `pytorch_model_fsdp[_{i}].bin` and `optimizer[_{i}].bin`.

The save functions write into the folder they are given (the caller commits it atomically) and return
the files this rank wrote, relative to that folder.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

import torch
import torch.distributed as dist

from ..training.optimizer import AcceleratedOptimizer

MODEL_DIR = "pytorch_model_fsdp_{index}"
OPTIMIZER_DIR = "optimizer_{index}"
FULL_MODEL_FILE = "pytorch_model_fsdp.bin"
FULL_OPTIMIZER_FILE = "optimizer.bin"
# The checkpoint reader's opener of verified content: name relative to the folder -> binary file.
OpenFile = Callable[[str], IO[bytes]]


def _indexed(name: str, index: int) -> str:
    stem, suffix = os.path.splitext(name)
    return name if index == 0 else f"{stem}_{index}{suffix}"


def _rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def _inner_optimizer(optimizer: Any) -> torch.optim.Optimizer:

    while isinstance(optimizer, AcceleratedOptimizer):
        optimizer = optimizer.optimizer
    return optimizer


def _options(full: bool, offload: bool = True) -> Any:
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(full_state_dict=full, cpu_offload=full and offload)


def full_model_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The whole (unsharded) state dict on the main process, on CPU; an empty dict on the others."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    return get_model_state_dict(model, options=_options(True))


def _files_of_this_rank(folder: Path, base: Path) -> list[str]:
    """The files of a checkpoint folder that this rank wrote: its `__{rank}_*.distcp`, and the rest on rank 0."""
    rank = _rank()
    mine = []
    for path in sorted(folder.rglob("*")):
        if not path.is_file():
            continue
        name = path.name
        if name.endswith(".distcp"):
            owner = name[2:].split("_", 1)[0] if name.startswith("__") else "0"
            if owner.isdigit() and int(owner) == rank:
                mine.append(path.relative_to(base).as_posix())
        elif rank == 0:
            mine.append(path.relative_to(base).as_posix())
    return mine


def optimizer_state_to_save(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer, options: Any = None
) -> dict[str, Any]:
    """The state dict of `optimizer` (training `model`) to write into a checkpoint, as torch's
    `get_optimizer_state_dict(model, optimizer, options=options)` gives it, except that an optimizer
    that has not stepped yet is left as it was and its state says 0 steps (see
    `_undo_initialization`). Collective wherever torch's function is."""
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    fresh = not optimizer.state
    state = get_optimizer_state_dict(model, optimizer, options=options)
    if fresh:
        _undo_initialization(optimizer, state)
    return state


def _undo_initialization(optimizer: torch.optim.Optimizer, state: dict[str, Any]) -> None:
    """torch's get_optimizer_state_dict gives an optimizer that has not stepped yet a state by taking
    one step with zero gradients and a zero learning rate, which counts as a step (Adam's `step`
    becomes 1, and with it its bias correction). Saved before the first step, the optimizer is left
    as it was and the checkpoint says 0 steps, so neither the run nor its resumption changes (the
    moments that zero step wrote are Adam's zeros, which its first real step starts from too)."""
    optimizer.state.clear()
    # A full state dict may leave the ranks that do not write it without a "state" entry.
    for per_parameter in state.get("state", {}).values():
        step = per_parameter.get("step")
        if isinstance(step, torch.Tensor):
            per_parameter["step"] = torch.zeros_like(step)
        elif step is not None:
            per_parameter["step"] = 0


def save_sharded(
    directory: str | os.PathLike,
    models: Sequence[torch.nn.Module],
    optimizers: Sequence[Any],
    *,
    full: bool,
    optimizer_models: Sequence[torch.nn.Module] | None = None,
    offload: bool = True,
    first_index: int = 0,
) -> list[str]:
    """Write the models' and optimizers' state into `directory`; return this rank's files.

    `optimizer_models[i]` is the model whose parameters optimizer `i` trains (the first model by default).
    `offload=False` gathers full state dicts on every rank instead of on the main process's CPU memory
    (FSDP1 on CPU cannot do the latter). `first_index`: the number of the first model and optimizer
    in the file names (Accelerate's `save_fsdp_model(..., model_index=i)` writes one of several).
    """
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    base = Path(directory)
    base.mkdir(parents=True, exist_ok=True)
    written: list[str] = []
    for index, model in enumerate(models, first_index):
        state = get_model_state_dict(model, options=_options(full, offload))
        if full:
            name = _indexed(FULL_MODEL_FILE, index)
            if _rank() == 0:
                torch.save(state, base / name)
                written.append(name)
        else:
            folder = base / MODEL_DIR.format(index=index)
            folder.mkdir(exist_ok=True)
            dcp.save({"model": state}, storage_writer=dcp.FileSystemWriter(folder))
            written += _files_of_this_rank(folder, base)
    owners = list(optimizer_models or [])
    for position, optimizer in enumerate(optimizers):
        index = first_index + position
        model = owners[position] if position < len(owners) else models[0]
        inner = _inner_optimizer(optimizer)
        state = optimizer_state_to_save(model, inner, _options(full, offload))
        if full:
            name = _indexed(FULL_OPTIMIZER_FILE, index)
            if _rank() == 0:
                torch.save(state, base / name)
                written.append(name)
        else:
            folder = base / OPTIMIZER_DIR.format(index=index)
            folder.mkdir(exist_ok=True)
            dcp.save({"optimizer": state}, storage_writer=dcp.FileSystemWriter(folder))
            written += _files_of_this_rank(folder, base)
    return written


def _require(path: Path, what: str) -> Path:
    if not path.exists():
        raise FileNotFoundError(
            f"[rank {_rank()}] Cannot load the {what}: {path} does not exist. Was this checkpoint saved "
            "with the same FSDP state_dict_type (FULL_STATE_DICT / SHARDED_STATE_DICT) and number of models?"
        )
    return path


def load_sharded(
    directory: str | os.PathLike,
    models: Sequence[torch.nn.Module],
    optimizers: Sequence[Any],
    *,
    full: bool,
    optimizer_models: Sequence[torch.nn.Module] | None = None,
    open_file: OpenFile | None = None,
    first_index: int = 0,
) -> None:
    """Load what `save_sharded` wrote into the (already sharded) models and optimizers.

    `open_file(name)`, given by the checkpoint's reader, returns a file object of the verified content
    of checkpoint file `name` (a path relative to `directory`, such as
    `pytorch_model_fsdp_0/__0_0.distcp`): every file is then read through it, so nothing is unpickled
    or applied that did not match its checksum. Without it, the files are read directly.
    `first_index`: the number of the first model and optimizer in the file names.
    """
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (
        get_model_state_dict,
        get_optimizer_state_dict,
        set_model_state_dict,
        set_optimizer_state_dict,
    )

    base = Path(directory)
    # Every rank checks the files before the first collective, so a missing file cannot hang the others.
    for index in range(first_index, first_index + len(models)):
        if full:
            if _rank() == 0:
                _require(base / _indexed(FULL_MODEL_FILE, index), f"model {index}")
        else:
            _require(base / MODEL_DIR.format(index=index), f"sharded model {index}")
    for index in range(first_index, first_index + len(optimizers)):
        if full:
            if _rank() == 0:
                _require(base / _indexed(FULL_OPTIMIZER_FILE, index), f"optimizer {index}")
        else:
            _require(base / OPTIMIZER_DIR.format(index=index), f"sharded optimizer {index}")

    for index, model in enumerate(models, first_index):
        if full:
            state = (
                _load_full(base, _indexed(FULL_MODEL_FILE, index), open_file)
                if _rank() == 0
                else {}
            )
            set_model_state_dict(model, state, options=_broadcast_options())
        else:
            state = {"model": get_model_state_dict(model, options=_options(False))}
            dcp.load(
                state,
                storage_reader=_reader(base, MODEL_DIR.format(index=index), open_file),
                planner=_load_planner(),
            )
            set_model_state_dict(model, state["model"], options=_options(False))
    owners = list(optimizer_models or [])
    for position, optimizer in enumerate(optimizers):
        index = first_index + position
        model = owners[position] if position < len(owners) else models[0]
        inner = _inner_optimizer(optimizer)
        if full:
            state = (
                _load_full(base, _indexed(FULL_OPTIMIZER_FILE, index), open_file)
                if _rank() == 0
                else {}
            )
            set_optimizer_state_dict(model, inner, state, options=_broadcast_options())
        else:
            state = {"optimizer": get_optimizer_state_dict(model, inner, options=_options(False))}
            dcp.load(
                state,
                storage_reader=_reader(base, OPTIMIZER_DIR.format(index=index), open_file),
                planner=_load_planner(),
            )
            set_optimizer_state_dict(model, inner, state["optimizer"], options=_options(False))


def _load_full(base: Path, name: str, open_file: OpenFile | None) -> Any:
    """A whole (FULL_STATE_DICT) state file, through the verified opener when there is one."""
    if open_file is None:
        return torch.load(base / name, weights_only=True)
    with open_file(name) as stream:
        return torch.load(stream, weights_only=True)


def _reader(base: Path, folder: str, open_file: OpenFile | None) -> Any:
    """torch.distributed.checkpoint's file reader of `base/folder`; with `open_file`, every file it
    opens (the pickled `.metadata` included) is served from the verified content instead."""
    import torch.distributed.checkpoint as dcp

    reader = dcp.FileSystemReader(base / folder)
    if open_file is not None:
        reader.fs = _verified_file_system(base, open_file)
    return reader


def _verified_file_system(base: Path, open_file: OpenFile) -> Any:
    """A torch.distributed.checkpoint file system that reads through `open_file` (read-only)."""
    from torch.distributed.checkpoint.filesystem import FileSystem

    class VerifiedFileSystem(FileSystem):
        @contextmanager
        def create_stream(self, path: str | os.PathLike, mode: str) -> Iterator[IO[bytes]]:
            if mode != "rb":
                raise ValueError(f"a checkpoint being loaded is read-only (asked for {mode!r})")
            name = Path(path).relative_to(base).as_posix()
            with open_file(name) as stream:
                yield stream

    return VerifiedFileSystem()


def _load_planner() -> Any:
    """torch.distributed.checkpoint's default load planner, minus the flattening of sharded tensors.

    On a world size where one of FSDP1's ShardedTensors (a parameter's or an optimizer moment's shard)
    has no local part on this rank, the default planner drops that key from this rank's request, then
    takes the key the checkpoint has and this rank lacks for the sign of a checkpoint written by torch
    2.3 or older, re-flattens the whole state the old way (a list of dicts such as `param_groups`
    becomes one leaf) and fails with "Missing key in checkpoint state_dict: optimizer.param_groups".
    Unflattened, an empty ShardedTensor stays and simply reads nothing. Cadence never nests a
    ShardedTensor in another (FSDP1 with 2D parallelism), the one case that flattening is for, and
    FSDP2's DTensors are not ShardedTensors: the option changes nothing else.
    """
    from torch.distributed.checkpoint import DefaultLoadPlanner

    return DefaultLoadPlanner(flatten_sharded_tensors=False)


def _broadcast_options() -> Any:
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)


def merge_sharded_checkpoint(checkpoint_dir: str | os.PathLike) -> dict[str, Any]:
    """Read a `torch.distributed.checkpoint` folder in this one process into one full state dict."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.format_utils import _EmptyStateDictLoadPlanner
    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict

    state: dict[str, Any] = {}
    _load_state_dict(
        state,
        storage_reader=dcp.FileSystemReader(os.fspath(checkpoint_dir)),
        planner=_EmptyStateDictLoadPlanner(),
        no_dist=True,
    )
    if len(state) == 1 and isinstance(next(iter(state.values())), dict):
        state = next(iter(state.values()))
    return state
