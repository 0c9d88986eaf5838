"""Where a prepared dataloader stands, as a state dict of plain Python values and tensors.

An epoch's order is decided by random number generators when it starts: the sampler's generator (kept
identical on every process) or torch's global generator (a RandomSampler without generator, the
DataLoader's worker seed). The position records their states at the start of the current epoch and
the number of batches handed out since; resuming restores those states, replays the epoch's order and
drops the batches already seen. Between epochs only the generators' current states are needed.
"""

from __future__ import annotations

from typing import Any

import torch

from .elastic import (
    GLOBAL_KEY,
    GLOBAL_ORDER_KEY,
    adopt_generators,
    global_record,
    needs_global_resume,
    resharded,
)
from .samplers import draws_from_global_rng, get_sampler
from .stateful_layout import TORCHDATA_SKIPS, from_torchdata_layout, is_torchdata_layout

STATE_VERSION = 1
_KEYS = ("version", "epoch", "batches_yielded", "in_epoch", "generator_names", "generator_states")


class LoaderPosition:
    """Epoch and progress of one prepared dataloader (shared with those skip_first_batches derives)."""

    __slots__ = (
        "epoch",
        "yielded",
        "in_epoch",
        "epoch_start",
        "pending",
        "last_epoch_batches",
        "source_offset",
    )

    def __init__(self, epoch: int = 0) -> None:
        self.epoch = epoch
        self.yielded = 0  # batches handed out in the current epoch, skipped ones included
        self.in_epoch = False
        self.epoch_start: dict[str, Any] | None = None  # RNG states when the current epoch began
        self.pending: dict[str, Any] | None = (
            None  # a loaded mid-epoch state for the next iteration
        )
        self.last_epoch_batches: int | None = None  # batches of the epoch that just ended
        # Source batches of the epoch's global order consumed before `yielded` started counting
        # (an epoch resumed on another number of processes; see data/elastic.py).
        self.source_offset = 0

    def start_epoch(
        self, snapshot: dict[str, Any], already_yielded: int, source_offset: int = 0
    ) -> None:
        """Start an epoch from `snapshot`, with `already_yielded` batches already served (and
        `source_offset` source batches consumed globally before them)."""
        self.last_epoch_batches = None
        self.epoch_start = snapshot
        self.yielded = already_yielded
        self.source_offset = source_offset
        self.in_epoch = True

    def finish_epoch(self) -> None:
        """Mark the current epoch as finished and move on to the next one."""
        self.last_epoch_batches = self.yielded
        self.epoch += 1
        self.yielded = 0
        self.source_offset = 0
        self.in_epoch = False
        self.epoch_start = None

    def take_pending(self) -> dict[str, Any] | None:
        """Return the pending resume state, if any, and clear it."""
        pending, self.pending = self.pending, None
        return pending

    # A pass left before its end: zip(a, b) stops at a's end without pulling from b again (a break
    # leaves one too), and a DataLoader's next iter() simply starts afresh.
    def restart_if_left(self) -> None:
        """At a new iter(): a pass left unfinished is over; the new pass starts afresh (the same
        epoch, as Accelerate's left iterator does), and a checkpoint saved before its first batch
        says so instead of resuming the rest of the old pass."""
        if self.pending is None and self.in_epoch:
            self.in_epoch, self.yielded = False, 0

    def resumes_after_the_end(self, batches: int, samples: int, drop_last: bool) -> bool:
        """Whether the pending resume is after its epoch's last batch (of `batches` on this
        process; of `samples` in the dataset, for a resume from another number of processes): its
        pass holds nothing and ends when its iterator is made, as a DataLoader's epoch starts at
        iter(), so a loader zipped behind another stays in step."""
        resume = self.pending
        if resume is None or not resume.get("in_epoch"):
            return False
        if resume.get("source_skip"):  # saved on another number of processes: its global count
            record = resume.get(GLOBAL_KEY) or {}
            short = (record.get("source_batch_size") or 1) - 1 if drop_last else 0
            seen = record.get("samples")
            return isinstance(seen, int) and seen >= samples - short
        return int(resume.get("batches_yielded", 0)) >= batches


def named_generators(loader: Any) -> list[tuple[str, torch.Generator]]:
    """The distinct torch.Generator objects that decide a loader's order, in a fixed order."""

    candidates = [
        ("synchronized", getattr(loader, "synchronized_generator", None)),
        ("sampler", getattr(_safe(get_sampler, loader), "generator", None)),
        ("loader", getattr(loader, "generator", None)),
        ("dataset", getattr(loader.dataset, "generator", None)),
        ("source_dataset", getattr(getattr(loader.dataset, "dataset", None), "generator", None)),
    ]
    found: list[tuple[str, torch.Generator]] = []
    for name, generator in candidates:
        if isinstance(generator, torch.Generator) and all(generator is not g for _, g in found):
            found.append((name, generator))
    return found


def _safe(function: Any, *args: Any) -> Any:
    try:
        return function(*args)
    except Exception:  # noqa: BLE001 - a loader without sampler has no sampler generator
        return None


def take_snapshot(loader: Any, with_global: bool) -> dict[str, Any]:
    """Capture the states of the loader's random generators (and the global torch RNG if asked)."""
    generators = named_generators(loader)
    snapshot = {
        "generator_names": [name for name, _ in generators],
        "generator_states": [generator.get_state() for _, generator in generators],
    }
    if with_global:
        snapshot["torch_rng_state"] = torch.get_rng_state()
        # The epoch's order comes from that global state, not from a generator above.
        snapshot[GLOBAL_ORDER_KEY] = draws_from_global_rng(_safe(get_sampler, loader))
    return snapshot


_OTHER_NAME = {"sampler": "synchronized", "synchronized": "sampler"}


def restore_generators(loader: Any, snapshot: dict[str, Any]) -> None:
    """Restore the loader's random generators from `snapshot`; raise if one is missing."""
    generators = dict(named_generators(loader))
    for name, state in zip(snapshot["generator_names"], snapshot["generator_states"]):
        # The sampler's generator is "synchronized" on several processes and "sampler" on one: a
        # state saved on another number of processes names it the other way.
        generator = generators.get(name) or generators.get(_OTHER_NAME.get(name, ""))
        if generator is None:
            raise ValueError(
                f"This dataloader state holds the state of a {name!r} random generator but the "
                f"dataloader has none ({', '.join(generators) or 'no generators'}). Load the state "
                "into a dataloader prepared the same way as the one that saved it."
            )
        generator.set_state(state)


def position_state_dict(loader: Any, position: LoaderPosition) -> dict[str, Any]:
    """The loader's exact resumable position (epoch, batches handed out, generator states)."""
    if position.pending is not None:
        pending = dict(position.pending)
        pending.pop("source_skip", None)  # its global count says it again when loaded
        return pending
    if position.in_epoch and position.epoch_start is not None:
        snapshot = position.epoch_start
    else:
        snapshot = take_snapshot(loader, with_global=False)
    state = {
        "version": STATE_VERSION,
        "epoch": position.epoch,
        "batches_yielded": position.yielded if position.in_epoch else 0,
        "in_epoch": position.in_epoch,
        "generator_names": list(snapshot["generator_names"]),
        "generator_states": [s.clone() for s in snapshot["generator_states"]],
    }
    in_epoch = position.in_epoch
    state[GLOBAL_KEY] = global_record(
        loader, position.yielded if in_epoch else 0, position.source_offset if in_epoch else 0
    )
    if position.in_epoch and "torch_rng_state" in snapshot:
        state["torch_rng_state"] = snapshot["torch_rng_state"].clone()
        if snapshot.get(GLOBAL_ORDER_KEY):
            state[GLOBAL_ORDER_KEY] = True
    return state


def load_position(loader: Any, position: LoaderPosition, state: dict[str, Any]) -> None:
    """Load a saved position into `position`; a mid-epoch one is applied at the next iteration."""
    if is_torchdata_layout(state):
        state = from_torchdata_layout(state, position.epoch)
    _validate(state)
    if not getattr(loader, "resume_exact_order", True) and not state.get(TORCHDATA_SKIPS):
        state = _as_reference_resume(loader, state)
    else:
        adopt_generators(loader, list(state["generator_names"]))
        if needs_global_resume(loader, state):
            state = resharded(loader, state)  # saved on another number of processes
    if state["in_epoch"]:
        # Applied when the next iteration starts: generators, global RNG and skip together.
        position.pending = dict(state)
        position.in_epoch = False
        position.epoch_start = None
        position.yielded = 0
    else:
        restore_generators(loader, state)
        position.pending = None
        position.in_epoch = False
        position.yielded = 0
    position.epoch = int(state["epoch"])


def _validate(state: Any) -> None:
    if not isinstance(state, dict):
        raise TypeError(
            f"A dataloader state must be the dict returned by state_dict(), got {type(state).__name__}."
        )
    missing = [key for key in _KEYS if key not in state]
    if missing:
        raise ValueError(
            f"This is not a Cadence dataloader state (missing {', '.join(missing)}); pass the dict "
            "returned by the prepared dataloader's state_dict()."
        )
    if state["version"] != STATE_VERSION:
        raise ValueError(
            f"Dataloader state version {state['version']!r} is not supported (expected {STATE_VERSION})."
        )
    if len(state["generator_names"]) != len(state["generator_states"]):
        raise ValueError("Corrupt dataloader state: generator names and states do not match.")
    if not isinstance(state["batches_yielded"], int) or state["batches_yielded"] < 0:
        raise ValueError(f"Corrupt dataloader state: batches_yielded={state['batches_yielded']!r}.")


def _as_reference_resume(loader: Any, state: dict[str, Any]) -> dict[str, Any]:
    """What Accelerate keeps of a saved position (`resume_exact_order=False`): the order is drawn
    again from the random state of the moment; a stateful loader skips the batches already handed
    out, a plain one starts the epoch over (Accelerate saves no position for it)."""
    stateful = getattr(loader, "use_stateful_dataloader", False)
    in_epoch = bool(state["in_epoch"]) and stateful and state["batches_yielded"] > 0
    return {
        "version": STATE_VERSION,
        "epoch": state["epoch"],
        "batches_yielded": state["batches_yielded"] if in_epoch else 0,
        "in_epoch": in_epoch,
        "generator_names": [],
        "generator_states": [],
        "exact": False,
    }
