"""A stateful prepared dataloader's state, as torchdata's `StatefulDataLoader` writes it.

With `use_stateful_dataloader=True` a prepared loader is a real StatefulDataLoader, and its
`state_dict()` is exactly the one torchdata gives after the batches handed out so far (Accelerate
returns the same, and its tests compare the two dicts for equality). Cadence reads one batch ahead,
so the loader notes torchdata's state after fetching each batch and before the look-ahead; those
notes are what `state_dict()` returns while an epoch is under way.

torchdata's state resumes by counting: the order of the interrupted epoch is drawn again unless the
sampler itself is stateful. `save_state` therefore writes Cadence's exact position beside it, under
one more key (`_cadence_position`), which torchdata ignores; `load_state` replays the saved epoch
from it (docs/differences.md). A state without that key is handed to torchdata, which resumes it.
"""

from __future__ import annotations

import math
from typing import Any

CADENCE_KEY = "_cadence_position"
TORCHDATA_SKIPS = "skipped_by_torchdata"  # a counted position whose batches torchdata skips itself
_NUM_YIELDED = "_num_yielded"
_FINISHED = "_iterator_finished"
_SNAPSHOT = "_snapshot"


def live_state(loader: Any) -> dict[str, Any]:
    """torchdata's own state of `loader` now (it creates the iterator if none exists, as torchdata does)."""
    from torchdata.stateful_dataloader import StatefulDataLoader  # optional dependency

    return StatefulDataLoader.state_dict(loader)


def hand_to_torchdata(loader: Any, state: dict[str, Any]) -> None:
    """Let torchdata resume `state` at the loader's next iteration."""
    from torchdata.stateful_dataloader import StatefulDataLoader  # optional dependency

    StatefulDataLoader.load_state_dict(loader, state)


def forget_torchdata_state(loader: Any) -> None:
    """Drop torchdata's kept iterator and any state it was to resume: Cadence positions the loader."""
    loader.next_iter_state = None
    loader._iterator = None
    loader._initial_iter_for_state_dict = False


def with_cadence_position(state: dict[str, Any], cadence_state: dict[str, Any]) -> dict[str, Any]:
    """torchdata's `state` with Cadence's exact position beside it (what save_state writes)."""
    return {**state, CADENCE_KEY: cadence_state}


def split_cadence_position(state: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """torchdata's part of `state`, and Cadence's position when it holds one."""
    torchdata_part = {key: value for key, value in state.items() if key != CADENCE_KEY}
    return torchdata_part, state.get(CADENCE_KEY)


def is_torchdata_layout(state: Any) -> bool:
    """Whether `state` is a StatefulDataLoader state dict (Cadence's or one torchdata wrote)."""
    return isinstance(state, dict) and (
        CADENCE_KEY in state or _NUM_YIELDED in state or _SNAPSHOT in state
    )


def counted_batches(state: dict[str, Any]) -> int:
    """How many batches torchdata's `state` says were handed out in its epoch."""
    try:
        if _SNAPSHOT in state:  # a multi-worker state: the snapshot's count plus the steps since
            snapshot = state[_SNAPSHOT]
            count = int(snapshot["_snapshot_step"]) + int(state.get("_steps_since_snapshot", 0))
        else:
            count = int(state[_NUM_YIELDED])
    except (KeyError, TypeError, ValueError) as error:
        raise ValueError(
            "This dataloader state is not one torchdata's StatefulDataLoader wrote (its batch count "
            f"is missing or not a number: {error!r}); pass the dict returned by state_dict()."
        ) from None
    if count < 0:
        raise ValueError(f"Corrupt dataloader state: {count} batches handed out.")
    return count


def from_torchdata_layout(
    state: dict[str, Any],
    epoch: int,
    base_batches_per_batch: int = 1,
    skipped_by_torchdata: bool = False,
) -> dict[str, Any]:
    """The Cadence position in `state`: its own when Cadence wrote one, else one that counts the
    batches torchdata counted (`base_batches_per_batch` of them make one batch of this loader). The
    order is drawn afresh; with `skipped_by_torchdata` torchdata skips those batches itself."""
    if CADENCE_KEY in state:
        return state[CADENCE_KEY]
    count = math.ceil(counted_batches(state) / max(base_batches_per_batch, 1))
    in_epoch = not state.get(_FINISHED, False) and count > 0
    position = {
        "version": 1,  # position.STATE_VERSION (not imported: position imports this module)
        "epoch": epoch,
        "batches_yielded": count if in_epoch else 0,
        "in_epoch": in_epoch,
        "generator_names": [],
        "generator_states": [],
        "exact": False,
    }
    if skipped_by_torchdata:
        position[TORCHDATA_SKIPS] = True
    return position
