"""A prepared dataloader's state in the layout of torchdata's `StatefulDataLoader`.

With `use_stateful_dataloader=True` the reference returns the state dict of the StatefulDataLoader it
wraps, and scripts read its keys (`_num_yielded`, `_iterator_finished`...) or save it and load it
into another loader. Cadence returns the same keys, with the single-process meaning, and keeps its
own exact position under one more key (`_cadence_position`), which torchdata ignores. A state saved
by torchdata (or by the reference) loads too: Cadence then skips the batches it says were handed out.
"""

from __future__ import annotations

from typing import Any

CADENCE_KEY = "_cadence_position"
_NUM_YIELDED = "_num_yielded"
_FINISHED = "_iterator_finished"
_SNAPSHOT = "_snapshot"


def as_torchdata_layout(
    loader: Any, position: Any, cadence_state: dict[str, Any]
) -> dict[str, Any]:
    """`cadence_state` wrapped in the keys of a single-process StatefulDataLoader state dict."""
    in_epoch = bool(cadence_state.get("in_epoch"))
    if in_epoch:
        yielded = int(cadence_state["batches_yielded"])
    else:  # between epochs torchdata reports the finished epoch's count, marked finished
        yielded = position.last_epoch_batches or 0
    finished = bool(getattr(loader, "end_of_dataloader", False)) or (
        not in_epoch and position.last_epoch_batches is not None
    )
    return {
        "_index_sampler_state": None,
        "_sampler_iter_state": None,
        "_sampler_iter_yielded": yielded,
        _NUM_YIELDED: yielded,
        "_IterableDataset_len_called": None,
        "_shared_seed": None,
        "fetcher_state": None,
        "dataset_state": None,
        _FINISHED: finished,
        CADENCE_KEY: cadence_state,
    }


def is_torchdata_layout(state: Any) -> bool:
    """Whether `state` is a StatefulDataLoader state dict (Cadence's or one torchdata wrote)."""
    return isinstance(state, dict) and (
        CADENCE_KEY in state or _NUM_YIELDED in state or _SNAPSHOT in state
    )


def from_torchdata_layout(state: dict[str, Any], position: Any) -> dict[str, Any]:
    """The Cadence position in `state`: its own when Cadence wrote it, else one that skips the
    batches torchdata counted (the order is drawn afresh: torchdata's sampler state is not replayed)."""
    if CADENCE_KEY in state:
        return state[CADENCE_KEY]
    if _SNAPSHOT in state:  # a multi-worker state: the count is the snapshot's plus the steps since
        yielded = int(state[_SNAPSHOT]["_snapshot_step"]) + int(
            state.get("_steps_since_snapshot", 0)
        )
    else:
        yielded = int(state[_NUM_YIELDED])
    in_epoch = not state.get(_FINISHED, False) and yielded > 0
    return {
        "version": 1,  # position.STATE_VERSION (not imported: position imports this module)
        "epoch": position.epoch,
        "batches_yielded": yielded if in_epoch else 0,
        "in_epoch": in_epoch,
        "generator_names": [],
        "generator_states": [],
        "exact": False,
    }
