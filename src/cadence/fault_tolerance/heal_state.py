"""What a healing replica group receives from a peer, and how it takes it in: the prepared models,
optimizer and schedulers, the data positions and the random states (torchft's state-dict
functions call `send` on the peer and `load` on the healing group)."""

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
    ) -> None:
        self.group = group
        self.group_rank = group_rank
        self.group_world_size = group_world_size
        self.models = models
        self.optimizers = optimizers
        self.schedulers = schedulers
        self.loaders = loaders
        self.healed_from: int | None = None  # the peer of the last heal applied, until said
        self._moving: dict[str, Any] | None = None

    def capture_moving(self, capture: bool) -> None:
        """Capture (or, with False, forget) the data positions and random states as the step
        opens: a quorum formed beside the step sends from torchft's quorum thread while the
        step's forward pass may draw from them. A waited-for quorum sends before the step draws,
        from the state as it stands."""
        self._moving = _moving_state(self.loaders) if capture else None

    def send(self) -> dict[str, Any]:
        """The state a peer heals from. Weights, optimizer and scheduler change only after the
        commit, which waits for the quorum (and so for this send) to finish."""
        moving = self._moving if self._moving is not None else _moving_state(self.loaders)
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
        torch.set_rng_state(state["rng"]["torch"])
        random.setstate(state["rng"]["python"])
        numpy.random.set_state(state["rng"]["numpy"])
        self.healed_from = int(state["group"])


def _moving_state(loaders: list[Any]) -> dict[str, Any]:
    import numpy

    return {
        "loaders": [loader.state_dict() for loader in loaders],
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
