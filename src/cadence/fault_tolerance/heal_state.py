"""What a healing replica group receives from a peer, and how it takes it in: the prepared models,
optimizer and schedulers, the data positions and how many passes the script has made over each
prepared DataLoader, the objects registered for checkpointing, the accumulation counter and the
random states (torchft's state-dict functions call `send` on the peer and `load` on the healing
group)."""

from __future__ import annotations

import random
from typing import Any

import torch

from .shards import local_shards, rebuild_shards, shard_mesh


class GroupSizeMismatch(RuntimeError):
    """The replica groups of a job run different numbers of processes (refused: rank r of every
    group must hold the same shard and take the same slice of a step)."""


class HealState:
    """The heal's payload over the session's prepared objects (the lists are the session's own,
    read when a heal sends or applies).

    Args:
        group: this replica group's index.
        group_rank / group_world_size: this process's rank and its group's process count.
        models / optimizers / schedulers / loaders: the prepared objects, as the session holds them.
        counters / registered: objects with `state_dict` / `load_state_dict` that heal as they
            stand when the step opens: the session's counters (the accumulation counter) and the
            objects registered for checkpointing (the Accelerator's list, in the order every
            group's script registers them).
    """

    def __init__(
        self,
        group: int,
        group_rank: int,
        group_world_size: int,
        *,
        models: list[torch.nn.Module],
        optimizers: list[Any],
        schedulers: list[Any],
        loaders: list[Any],
        counters: list[Any] | None = None,
        registered: list[Any] | None = None,
    ) -> None:
        self.group = group
        self.group_rank = group_rank
        self.group_world_size = group_world_size
        self.models = models
        self.optimizers = optimizers
        self.schedulers = schedulers
        self.loaders = loaders
        self.counters = counters if counters is not None else []
        self.registered = registered if registered is not None else []
        self.healed_from: int | None = None  # the peer of the last heal applied, until said
        self._moving: dict[str, Any] | None = None

    @property
    def stateful(self) -> list[Any]:
        """The counters, then the registered objects."""
        return [*self.counters, *self.registered]

    def capture_moving(self, capture: bool) -> None:
        """Capture (or, with False, forget) the data positions and random states as the step
        opens: a quorum formed beside the step sends from torchft's quorum thread while the
        step's forward pass may draw from them. A waited-for quorum sends before the step draws,
        from the state as it stands."""
        self._moving = _moving_state(self.loaders, self.stateful) if capture else None

    def send(self) -> dict[str, Any]:
        """The state a peer heals from. Weights, optimizer and scheduler change only after the
        commit, which waits for the quorum (and so for this send) to finish."""
        moving = self._moving
        if moving is None:
            moving = _moving_state(self.loaders, self.stateful)
        # FSDP2's DTensors travel as this rank's local shards (shards.py says why).
        return {
            "group": self.group,
            "group_rank": self.group_rank,
            "group_world_size": self.group_world_size,
            "models": [local_shards(_unwrap(model).state_dict()) for model in self.models],
            "optimizers": [
                local_shards(optimizer.optimizer.state_dict()) for optimizer in self.optimizers
            ],
            "schedulers": [scheduler.scheduler.state_dict() for scheduler in self.schedulers],
            **moving,
        }

    def load(self, state: dict[str, Any]) -> None:
        """Take in a peer's state (see `send`).

        Raises:
            GroupSizeMismatch: the peer is another rank, or its group another size.
        """
        import numpy  # torch depends on it

        sender = (state["group_rank"], state["group_world_size"])
        if sender != (self.group_rank, self.group_world_size):
            raise GroupSizeMismatch(
                f"replica group {self.group}'s process {self.group_rank} of "
                f"{self.group_world_size} was sent the state of process {sender[0]} of {sender[1]} "
                f"of group {state['group']}: every replica group must run the same number of "
                "processes (--nproc_per_node and --num_machines alike on every group's launcher)"
            )
        # Checked before anything is changed.
        if len(state["stateful"]) != len(self.stateful):
            raise RuntimeError(
                f"replica group {self.group} registered {len(self.stateful)} objects for "
                f"checkpointing (with the accumulation counter), the group it heals from "
                f"{len(state['stateful'])}: register the same objects, in the same order, before "
                "the first step on every group"
            )
        for loader, record in zip(self.loaders, state["passes"]):
            loader.check_passes(record, self.group)
        for model, weights in zip(self.models, state["models"]):
            mesh = shard_mesh(_unwrap(model).parameters())
            _unwrap(model).load_state_dict(rebuild_shards(weights, mesh))
        for optimizer, optimizer_state in zip(self.optimizers, state["optimizers"]):
            parameters = [p for group in optimizer.param_groups for p in group["params"]]
            optimizer.load_state_dict(rebuild_shards(optimizer_state, shard_mesh(parameters)))
        for scheduler, scheduler_state in zip(self.schedulers, state["schedulers"]):
            scheduler.scheduler.load_state_dict(scheduler_state)
        for loader, position in zip(self.loaders, state["loaders"]):
            loader.load_state_dict(position)
        # The script restarted at its first line: its loops pass through what the job finished.
        for loader, record in zip(self.loaders, state["passes"]):
            loader.line_up(record)
        for obj, obj_state in zip(self.stateful, state["stateful"]):
            obj.load_state_dict(obj_state)
        torch.set_rng_state(state["rng"]["torch"])
        random.setstate(state["rng"]["python"])
        numpy.random.set_state(state["rng"]["numpy"])
        self.healed_from = int(state["group"])


def _moving_state(loaders: list[Any], stateful: list[Any]) -> dict[str, Any]:
    import copy

    import numpy

    return {
        "loaders": [loader.state_dict() for loader in loaders],
        "passes": [loader.pass_record() for loader in loaders],
        # A copy: the script may change its objects while a quorum formed beside the step sends.
        "stateful": [copy.deepcopy(obj.state_dict()) for obj in stateful],
        "rng": {
            "torch": torch.get_rng_state(),
            "python": random.getstate(),
            "numpy": numpy.random.get_state(),
        },
    }


def _unwrap(model: torch.nn.Module) -> torch.nn.Module:
    while hasattr(model, "module") and isinstance(model.module, torch.nn.Module):
        model = model.module
    return model
