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
        # The positions and pass records of the peer's loaders this group had not prepared yet
        # when it healed, by index (see `line_up_later`).
        self._later: dict[int, tuple[Any, Any]] = {}

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
            "script_schedulers": [s.state_dict() for s in script_schedulers(self)],
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
        unprepared = script_schedulers(self)
        sent = state.get("script_schedulers", [])
        if len(sent) != len(unprepared):
            raise RuntimeError(
                f"replica group {self.group} steps {len(unprepared)} learning-rate schedulers it "
                f"did not prepare, the group it heals from {len(sent)}: create the same "
                "schedulers on every group (or prepare them with the optimizer)"
            )
        for model, weights in zip(self.models, state["models"]):
            mesh = shard_mesh(_unwrap(model).parameters())
            _unwrap(model).load_state_dict(rebuild_shards(weights, mesh))
        for optimizer, optimizer_state in zip(self.optimizers, state["optimizers"]):
            parameters = [p for group in optimizer.param_groups for p in group["params"]]
            optimizer.load_state_dict(rebuild_shards(optimizer_state, shard_mesh(parameters)))
        for scheduler, scheduler_state in zip(self.schedulers, state["schedulers"]):
            scheduler.scheduler.load_state_dict(scheduler_state)
        for scheduler, scheduler_state in zip(unprepared, sent):
            scheduler.load_state_dict(scheduler_state)
        for loader, position in zip(self.loaders, state["loaders"]):
            loader.load_state_dict(position)
        # The script restarted at its first line: its loops pass through what the job finished.
        for loader, record in zip(self.loaders, state["passes"]):
            loader.line_up(record)
        held = len(self.loaders)
        self._later = {
            index: (position, record)
            for index, (position, record) in enumerate(zip(state["loaders"], state["passes"]))
            if index >= held
        }
        for obj, obj_state in zip(self.stateful, state["stateful"]):
            obj.load_state_dict(obj_state)
        torch.set_rng_state(state["rng"]["torch"])
        random.setstate(state["rng"]["python"])
        numpy.random.set_state(state["rng"]["numpy"])
        self.healed_from = int(state["group"])

    def line_up_later(self, loader: Any, index: int) -> None:
        """Line `loader`, prepared at `index` after this group healed, up with the peer's loader
        prepared there (its position and passes: an evaluation the job ran is replayed); a
        loader the peer had not prepared either is new to the job and runs live.

        Raises:
            RuntimeError: the script has started more passes over it than the job (check_passes).
        """
        later = self._later.pop(index, None)
        if later is None:
            return
        position, record = later
        loader.check_passes(record, self.group)
        loader.load_state_dict(position)
        loader.line_up(record)


def script_schedulers(heal: HealState) -> list[Any]:
    """The learning-rate schedulers over the prepared optimizer that were not prepared (transformers'
    Trainer creates its scheduler over the prepared optimizer and steps it itself): a healing group
    receives their state too, or its schedule would start again at its first step. Found among the
    objects that refer to the optimizer (the script holds them; nothing else names them); one such
    scheduler per job in practice (several are paired in the order found)."""
    import gc

    from torch.optim.lr_scheduler import LRScheduler, ReduceLROnPlateau

    targets = [o for opt in heal.optimizers for o in (opt, getattr(opt, "optimizer", None)) if o]
    if not targets:
        return []
    prepared = {id(scheduler.scheduler) for scheduler in heal.schedulers}
    referrers = gc.get_referrers(*targets)
    # An object whose attributes were read as a dict (a scheduler's state_dict does) refers to
    # them through that dict: the dict's owners are looked up too (one more scan).
    dicts = [obj for obj in referrers if isinstance(obj, dict)]
    if dicts:
        ids = {id(d) for d in dicts}
        referrers += [
            obj for obj in gc.get_referrers(*dicts) if id(getattr(obj, "__dict__", None)) in ids
        ]
    found: list[Any] = []
    for obj in referrers:
        if isinstance(obj, (LRScheduler, ReduceLROnPlateau)) and id(obj) not in prepared:
            if all(obj is not seen for seen in found):
                found.append(obj)
    return found


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
