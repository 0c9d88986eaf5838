"""Exact resume: a loader saved mid-epoch continues with the next batch, same order, same RNG after.

The reference run iterates three epochs uninterrupted. The resumed run is a fresh loader built the
same way (as a restarted script would), given the saved state through torch.save/torch.load with
weights_only=True, after torch's global RNG was put back to its saved value (as load_state does).
"""

from __future__ import annotations

import io

import pytest
import torch
from torch.utils.data import DataLoader, IterableDataset

from cadence.data import prepare_data_loader, skip_first_batches

EPOCHS = 3


class ShuffledStream(IterableDataset):
    """An iterable dataset shuffling with its own generator, reseeded by set_epoch-less sharding."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.generator = torch.Generator().manual_seed(5)

    def __iter__(self):
        return iter(torch.randperm(self.size, generator=self.generator).tolist())


CASES = {
    "shuffled-2-ranks": lambda rank: _prepared(
        DataLoader(range(23), batch_size=3, shuffle=True), rank
    ),
    "shuffled-drop-last": lambda rank: _prepared(
        DataLoader(range(23), batch_size=3, shuffle=True, drop_last=True), rank
    ),
    "shuffled-split": lambda rank: _prepared(
        DataLoader(range(23), batch_size=4, shuffle=True), rank, split_batches=True
    ),
    "shuffled-one-process": lambda rank: prepare_data_loader(
        DataLoader(range(23), batch_size=3, shuffle=True), rng_types=["generator"]
    ),
    "seedable": lambda rank: _prepared(
        DataLoader(range(23), batch_size=3, shuffle=True), rank, use_seedable_sampler=True
    ),
    "sequential": lambda rank: _prepared(DataLoader(range(23), batch_size=3), rank),
    "iterable": lambda rank: _prepared(DataLoader(ShuffledStream(23), batch_size=3), rank),
    "workers": lambda rank: _prepared(
        DataLoader(range(23), batch_size=3, shuffle=True, num_workers=2, persistent_workers=True),
        rank,
    ),
    "stateful": lambda rank: _prepared(
        DataLoader(range(23), batch_size=3, shuffle=True), rank, use_stateful_dataloader=True
    ),
}


def _prepared(dataloader, rank, **options):
    return prepare_data_loader(
        dataloader, num_processes=2, process_index=rank, rng_types=["generator"], **options
    )


def build(case: str, rank: int):
    torch.manual_seed(0)  # the script's set_seed: the same generators in both runs
    return CASES[case](rank)


def as_lists(loader) -> list[list[int]]:
    return [batch.tolist() for batch in loader]


def through_file(state):
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=True)


def uninterrupted(case: str, rank: int):
    loader = build(case, rank)
    epochs = [as_lists(loader) for _ in range(EPOCHS)]
    return epochs, torch.rand(4)


def interrupted(case: str, rank: int, epoch: int, consumed: int):
    """Run until `consumed` batches of `epoch`, save, resume in a new loader; return all batches."""
    loader = build(case, rank)
    epochs = [as_lists(loader) for _ in range(epoch)]
    iterator = iter(loader)
    partial = [next(iterator).tolist() for _ in range(consumed)]
    # What save_state writes: for a stateful loader, Cadence's exact position beside torchdata's state.
    state, rng = through_file(loader.checkpoint_state_dict()), torch.get_rng_state()
    del iterator, loader

    resumed = build(case, rank)
    torch.rand(7)  # whatever the restarted script drew before loading
    torch.set_rng_state(rng)
    resumed.load_state_dict(state)
    assert resumed.iteration == epoch
    epochs.append(partial + as_lists(resumed))
    epochs += [as_lists(resumed) for _ in range(epoch + 1, EPOCHS)]
    return epochs, torch.rand(4)


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("epoch,consumed", [(0, 1), (1, 3), (2, 7)])
def test_resume_mid_epoch_continues_exactly(case, epoch, consumed):
    if case == "stateful":
        pytest.importorskip("torchdata.stateful_dataloader")
    for rank in range(2):
        expected, expected_rng = uninterrupted(case, rank)
        if consumed > len(expected[epoch]):
            continue
        got, rng = interrupted(case, rank, epoch, consumed)
        assert got == expected
        assert torch.equal(rng, expected_rng)


def test_expected_runs_really_shuffle_differently_per_epoch():
    epochs, _ = uninterrupted("shuffled-2-ranks", 0)
    assert epochs[0] != epochs[1] != epochs[2]


def test_state_between_epochs():
    for case in ("shuffled-2-ranks", "seedable", "iterable"):
        expected, _ = uninterrupted(case, 1)
        loader = build(case, 1)
        first = as_lists(loader)
        state = through_file(loader.state_dict())
        assert (state["epoch"], state["batches_yielded"], state["in_epoch"]) == (1, 0, False)
        resumed = build(case, 1)
        resumed.load_state_dict(state)
        assert [first] + [as_lists(resumed) for _ in range(EPOCHS - 1)] == expected


def test_state_after_the_last_batch_of_an_epoch():
    expected, _ = uninterrupted("shuffled-2-ranks", 0)
    loader = build("shuffled-2-ranks", 0)
    batches = []
    for batch in loader:
        batches.append(batch.tolist())
        if len(batches) == len(expected[0]):
            state = through_file(loader.state_dict())  # saved inside the loop, at its last step
    assert state["batches_yielded"] == len(expected[0])
    resumed = build("shuffled-2-ranks", 0)
    resumed.load_state_dict(state)
    assert as_lists(resumed) == []  # the rest of epoch 0 is empty
    assert as_lists(resumed) == expected[1]


def test_zipped_loaders_saved_after_the_last_batch_resume_together():
    """Two loaders iterated together (`zip(a, b)`), saved at an epoch's last step: resumed, the
    first pass is empty for both and the next is the next epoch for both. zip stops at `a`'s empty
    pass without pulling from `b`, so `b`'s pass must end when its iterator is made, as torch's
    DataLoader draws its epoch when `iter()` is called (the elastic campaign's seed 103: epoch 1
    was skipped without a word)."""
    expected = {case: uninterrupted(case, 0)[0] for case in ("shuffled-2-ranks", "sequential")}
    loaders = {case: build(case, 0) for case in expected}
    steps = len(expected["sequential"][0])
    for step, _ in enumerate(zip(*loaders.values()), start=1):
        if step == steps:
            states = {case: through_file(loader.state_dict()) for case, loader in loaders.items()}
    resumed = {case: build(case, 0) for case in expected}
    for case, loader in resumed.items():
        loader.load_state_dict(states[case])
    assert list(zip(*resumed.values())) == []  # the rest of epoch 0
    got = [[batch.tolist() for batch in pair] for pair in zip(*resumed.values())]
    assert [pair[0] for pair in got] == expected["shuffled-2-ranks"][1]
    assert [pair[1] for pair in got] == expected["sequential"][1]


def test_zipped_loaders_saved_after_the_last_batch_resume_together_on_one_process():
    """The same, saved on 2 processes and resumed on 1 (the elastic case: the position is global):
    the rest of epoch 0 is empty for both, then both read the whole of epoch 1."""
    loaders = {case: build(case, 0) for case in ("shuffled-2-ranks", "sequential")}
    steps = len(as_lists(build("sequential", 0)))
    for step, _ in enumerate(zip(*loaders.values()), start=1):
        if step == steps:
            states = {case: through_file(loader.state_dict()) for case, loader in loaders.items()}
    torch.manual_seed(0)
    resumed = {
        "shuffled-2-ranks": prepare_data_loader(
            DataLoader(range(23), batch_size=3, shuffle=True), rng_types=["generator"]
        ),
        "sequential": prepare_data_loader(DataLoader(range(23), batch_size=3)),
    }
    for case, loader in resumed.items():
        loader.load_state_dict(states[case])
    assert list(zip(*resumed.values())) == []  # the rest of epoch 0
    got = list(zip(*resumed.values()))
    assert sorted(i for pair in got for i in pair[0].tolist()) == list(range(23))
    assert [i for pair in got for i in pair[1].tolist()] == list(range(23))


ZIPPED = ("shuffled-2-ranks", "shuffled-drop-last", "shuffled-split", "seedable")


@pytest.mark.parametrize("first", ZIPPED)
@pytest.mark.parametrize("rank", [0, 1])
def test_zipped_loaders_saved_as_the_next_pass_starts_resume_as_they_would_have_gone_on(
    first, rank
):
    """zip(a, b) leaves b unfinished (at its last batch, or before it when a has fewer batches:
    drop_last); the next zip's iter() calls start both passes afresh (b's included, as a
    DataLoader's would), and a checkpoint saved then (a stop notice at the pass's first draw: the
    elastic campaign's seed 105) resumes with those fresh passes."""
    loaders = {case: build(case, rank) for case in (first, "sequential")}
    for _ in zip(*loaders.values()):
        pass
    iterators = [iter(loader) for loader in loaders.values()]
    states = {case: through_file(loader.state_dict()) for case, loader in loaders.items()}
    expected = [[batch.tolist() for batch in pair] for pair in zip(*iterators)]
    assert len(expected) == min(len(as_lists(build(case, rank))) for case in loaders)
    resumed = {case: build(case, rank) for case in loaders}
    for case, loader in resumed.items():
        loader.load_state_dict(states[case])
    assert [[batch.tolist() for batch in pair] for pair in zip(*resumed.values())] == expected


def test_state_is_plain_values_and_tensors():
    loader = build("shuffled-2-ranks", 0)
    next(iter(loader))
    state = loader.state_dict()

    def plain(value):
        if isinstance(value, (list, tuple)):
            return all(plain(v) for v in value)
        if isinstance(value, dict):
            return all(isinstance(k, str) and plain(v) for k, v in value.items())
        return value is None or isinstance(value, (bool, int, float, str, torch.Tensor))

    assert plain(state)
    assert state["batches_yielded"] == 1 and state["in_epoch"] is True
    assert through_file(state).keys() == state.keys()


def test_state_round_trips_before_iteration():
    loader = build("shuffled-2-ranks", 0)
    iterator = iter(loader)
    next(iterator)
    next(iterator)
    state = loader.state_dict()
    resumed = build("shuffled-2-ranks", 0)
    resumed.load_state_dict(state)
    again = resumed.state_dict()
    assert again["batches_yielded"] == 2 and again["epoch"] == 0
    assert all(
        torch.equal(a, b) for a, b in zip(again["generator_states"], state["generator_states"])
    )


def test_skip_first_batches_after_loading_replays_the_saved_epoch():
    """A script written for the reference library skips the consumed batches itself."""
    expected, _ = uninterrupted("shuffled-2-ranks", 0)
    loader = build("shuffled-2-ranks", 0)
    as_lists(loader)
    iterator = iter(loader)
    partial = [next(iterator).tolist() for _ in range(2)]
    state = through_file(loader.state_dict())
    resumed = build("shuffled-2-ranks", 0)
    resumed.load_state_dict(state)
    rest = as_lists(skip_first_batches(resumed, 2))
    assert [expected[0], partial + rest, as_lists(resumed)] == expected


def test_loading_a_wrong_state_is_a_clear_error():
    loader = build("shuffled-2-ranks", 0)
    with pytest.raises(TypeError, match="must be the dict returned by state_dict"):
        loader.load_state_dict([1, 2])
    with pytest.raises(ValueError, match="missing"):
        loader.load_state_dict({"epoch": 1})
    state = build("sequential", 0).state_dict()
    state["generator_names"] = ["dataset"]
    state["generator_states"] = [torch.Generator().get_state()]
    with pytest.raises(ValueError, match="'dataset' random generator"):
        loader.load_state_dict(state)
