"""The optimizer's state under pipeline parallelism, in torch.distributed.checkpoint folders.

Each stage's process writes the state of its own parameters, keyed by the model's parameter names,
so the folder is one model's optimizer state, loadable on another split. The parameter groups are the
one thing to change: torch's optimizer state dict lists each group's parameter names, which differ
from stage to stage, and torch.distributed.checkpoint keeps only one copy of a value every rank
writes under the same key. The groups are written without their names (their hyperparameters are
the same on every stage: one optimizer, one scheduler) and each process puts its own names back
when it loads.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from ..sharded_state import (
    OPTIMIZER_DIR,
    _files_of_this_rank,
    _inner_optimizer,
    _load_planner,
    _reader,
    _require,
    optimizer_state_to_save,
)


def _without_names(state: dict[str, Any]) -> dict[str, Any]:
    groups = [{k: v for k, v in group.items() if k != "params"} for group in state["param_groups"]]
    return {"state": state["state"], "param_groups": groups}


def save_optimizers(
    directory: Path, optimizers: list[Any], models: list[torch.nn.Module], first_index: int
) -> list[str]:
    """Write each optimizer's state for the parameters of its (local) model; returns this rank's files."""
    import torch.distributed.checkpoint as dcp

    written: list[str] = []
    for position, (optimizer, model) in enumerate(zip(optimizers, models)):
        state = optimizer_state_to_save(model, _inner_optimizer(optimizer))
        folder = directory / OPTIMIZER_DIR.format(index=first_index + position)
        folder.mkdir(parents=True, exist_ok=True)
        dcp.save({"optimizer": _without_names(state)}, storage_writer=dcp.FileSystemWriter(folder))
        written += _files_of_this_rank(folder, directory)
    return written


def load_optimizers(
    directory: Path,
    optimizers: list[Any],
    models: list[torch.nn.Module],
    first_index: int,
    open_file: Any = None,
) -> None:
    """Load what `save_optimizers` wrote (possibly with another split) into this rank's optimizers."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (
        get_optimizer_state_dict,
        set_optimizer_state_dict,
    )

    for position in range(len(optimizers)):
        _require(directory / OPTIMIZER_DIR.format(index=first_index + position), "optimizer")
    for position, (optimizer, model) in enumerate(zip(optimizers, models)):
        inner = _inner_optimizer(optimizer)
        current = get_optimizer_state_dict(model, inner)
        request = {"optimizer": _without_names(current)}
        folder = OPTIMIZER_DIR.format(index=first_index + position)
        dcp.load(
            request, storage_reader=_reader(directory, folder, open_file), planner=_load_planner()
        )
        loaded = request["optimizer"]
        for group, mine in zip(loaded["param_groups"], current["param_groups"]):
            group["params"] = mine["params"]
        set_optimizer_state_dict(model, inner, loaded)
