"""Which indices each process gets, len(), end_of_dataloader and remainder, in one process.

`num_processes` / `process_index` are passed explicitly, so every rank's loader is built here without
a process group; the expected values come from tests/data_model.py (the spec's rules) and from a few
cases written out by hand.
"""

from __future__ import annotations

import itertools

import pytest
import torch
from data_model import looped, split_batches, whole_batches
from torch.utils.data import BatchSampler, DataLoader, IterableDataset, SequentialSampler

from cadence.data import (
    BatchSamplerShard,
    DataLoaderShard,
    IterableDatasetShard,
    prepare_data_loader,
)
from cadence.state import GradientState


class Stream(IterableDataset):
    """0, 1, ..., size - 1 as an iterable dataset (with a length only if asked)."""

    def __init__(self, size: int) -> None:
        self.size = size

    def __iter__(self):
        return iter(range(self.size))


class SizedStream(Stream):
    def __len__(self) -> int:
        return self.size


def batches_of(loader) -> list[list[int]]:
    return [batch.tolist() for batch in loader]


def per_rank(make_loader, n):
    return [batches_of(make_loader(rank)) for rank in range(n)]


# -- hand-written cases ------------------------------------------------------------------------
def test_spec_example_whole_batches_loop_back():
    # 11 samples, batch 5, 2 processes: the last round is completed with 0, 1, ... from the start.
    got = per_rank(
        lambda r: prepare_data_loader(
            DataLoader(range(11), batch_size=5), num_processes=2, process_index=r
        ),
        2,
    )
    assert got == [[[0, 1, 2, 3, 4], [10, 0, 1, 2, 3]], [[5, 6, 7, 8, 9], [4, 5, 6, 7, 8]]]


def test_split_batches_cut_each_batch():
    got = per_rank(
        lambda r: prepare_data_loader(
            DataLoader(range(10), batch_size=4),
            num_processes=2,
            process_index=r,
            split_batches=True,
        ),
        2,
    )
    assert got == [[[0, 1], [4, 5], [8, 9]], [[2, 3], [6, 7], [0, 1]]]


def test_uneven_batches_without_even_batches():
    got = per_rank(
        lambda r: prepare_data_loader(
            DataLoader(range(11), batch_size=5),
            num_processes=2,
            process_index=r,
            even_batches=False,
        ),
        2,
    )
    assert got == [[[0, 1, 2, 3, 4], [10]], [[5, 6, 7, 8, 9]]]


def test_drop_last_drops_the_incomplete_round():
    got = per_rank(
        lambda r: prepare_data_loader(
            DataLoader(range(16), batch_size=3, drop_last=True), num_processes=2, process_index=r
        ),
        2,
    )
    # 5 full batches: rounds (0,1) and (2,3) are complete, batch 4 ([12, 13, 14]) has no partner.
    assert got == [[[0, 1, 2], [6, 7, 8]], [[3, 4, 5], [9, 10, 11]]]


def test_dataset_smaller_than_one_round_loops_several_times():
    got = per_rank(
        lambda r: prepare_data_loader(
            DataLoader(range(3), batch_size=4), num_processes=2, process_index=r
        ),
        2,
    )
    assert got == [[[0, 1, 2, 0]], [[1, 2, 0, 1]]]


def test_iterable_dataset_each_rank_takes_its_slice():
    got = per_rank(
        lambda r: prepare_data_loader(
            DataLoader(Stream(11), batch_size=2), num_processes=3, process_index=r
        ),
        3,
    )
    # global batches of 6: [0..5], [6..10, 0]; rank r takes samples 2r, 2r + 1 of each.
    assert got == [[[0, 1], [6, 7]], [[2, 3], [8, 9]], [[4, 5], [10, 0]]]


def test_variable_size_batch_sampler_loops_whole_batches():
    class Growing:
        """Batches of 1, 2, 3 samples, then 1 again."""

        def __iter__(self):
            yield from ([0], [1, 2], [3, 4, 5], [6])

        def __len__(self):
            return 4

    got = per_rank(
        lambda r: prepare_data_loader(
            DataLoader(range(7), batch_sampler=Growing()), num_processes=3, process_index=r
        ),
        3,
    )
    # Round 2 is [6] alone: it is completed with the first batches of the epoch.
    assert got == [[[0], [6]], [[1, 2], [0]], [[3, 4, 5], [1, 2]]]


class Opaque:
    """A batch sampler that is not a torch BatchSampler: sharded through the general path."""

    def __init__(self, inner: BatchSampler) -> None:
        self.inner = inner
        self.batch_size = inner.batch_size
        self.drop_last = inner.drop_last

    def __iter__(self):
        return iter(self.inner)

    def __len__(self):
        return len(self.inner)


# -- the rules over a grid ---------------------------------------------------------------------
GRID = list(
    itertools.product(
        [1, 3, 7, 8, 9, 10, 16, 17],  # dataset sizes
        [1, 2, 3, 4],  # batch sizes
        [1, 2, 3],  # processes
        [True, False],  # even_batches
        [False, True],  # drop_last
    )
)


@pytest.mark.parametrize("size,batch_size,n,even,drop_last", GRID)
def test_whole_batches_follow_the_rules(size, batch_size, n, even, drop_last):
    for rank in range(n):
        loader = prepare_data_loader(
            DataLoader(range(size), batch_size=batch_size, drop_last=drop_last),
            num_processes=n,
            process_index=rank,
            even_batches=even,
        )
        expected = whole_batches(list(range(size)), batch_size, n, rank, even, drop_last)
        assert batches_of(loader) == expected
        assert len(loader) == len(expected)


@pytest.mark.parametrize("size,batch_size,n,even,drop_last", GRID)
def test_split_batches_follow_the_rules(size, batch_size, n, even, drop_last):
    batch_size *= n
    for rank in range(n):
        loader = prepare_data_loader(
            DataLoader(range(size), batch_size=batch_size, drop_last=drop_last),
            num_processes=n,
            process_index=rank,
            split_batches=True,
            even_batches=even,
        )
        expected = split_batches(list(range(size)), batch_size, n, rank, even, drop_last)
        assert batches_of(loader) == expected
        assert len(loader) == len(expected)


@pytest.mark.parametrize("size,batch_size,n,even,drop_last", GRID)
def test_custom_batch_sampler_is_sharded_like_the_default(size, batch_size, n, even, drop_last):
    for rank in range(n):
        sampler = BatchSampler(SequentialSampler(range(size)), batch_size, drop_last)

        for batch_sampler in (sampler, Opaque(sampler)):
            loader = prepare_data_loader(
                DataLoader(range(size), batch_sampler=batch_sampler),
                num_processes=n,
                process_index=rank,
                even_batches=even,
            )
            expected = whole_batches(list(range(size)), batch_size, n, rank, even, drop_last)
            assert batches_of(loader) == expected
            assert len(loader) == len(expected)


@pytest.mark.parametrize("size,batch_size,n,split,drop_last", [
    (size, batch_size, n, split, drop_last)
    for size, batch_size, n, _, drop_last in GRID
    for split in (False, True)
])  # fmt: skip
def test_iterable_datasets_follow_the_rules(size, batch_size, n, split, drop_last):
    if split:
        batch_size *= n
    stream = list(range(size))
    for rank in range(n):
        for dataset in (Stream(size), SizedStream(size)):
            loader = prepare_data_loader(
                DataLoader(dataset, batch_size=batch_size, drop_last=drop_last),
                num_processes=n,
                process_index=rank,
                split_batches=split,
            )
            if split:
                expected = split_batches(stream, batch_size, n, rank, True, drop_last)
            else:
                expected = whole_batches(stream, batch_size, n, rank, True, drop_last)
                if drop_last:
                    expected = [b for b in expected if len(b) == batch_size]
            assert batches_of(loader) == expected
            if isinstance(dataset, SizedStream):
                assert len(loader) == len(expected)


def test_one_process_changes_nothing():
    original = DataLoader(range(10), batch_size=3)
    loader = prepare_data_loader(original, num_processes=1, process_index=0)
    assert isinstance(loader, DataLoaderShard)
    assert batches_of(loader) == batches_of(original)
    assert len(loader) == 4
    assert loader.batch_sampler is original.batch_sampler


# -- wrappers used directly --------------------------------------------------------------------
def test_batch_sampler_shard_directly():
    source = BatchSampler(SequentialSampler(range(10)), 3, False)
    shards = [list(BatchSamplerShard(source, 2, rank)) for rank in range(2)]
    assert shards == [[[0, 1, 2], [6, 7, 8]], [[3, 4, 5], [9, 0, 1]]]
    with pytest.raises(ValueError, match="multiple of the number of processes"):
        BatchSamplerShard(source, 2, 0, split_batches=True)


def test_iterable_dataset_shard_directly():
    shards = [
        list(IterableDatasetShard(Stream(5), 2, num_processes=2, process_index=r)) for r in range(2)
    ]
    assert shards == [[0, 1, 4, 0], [2, 3, 1, 2]]
    assert len(IterableDatasetShard(SizedStream(5), 2, num_processes=2)) == 4
    assert looped([1, 2], 5) == [1, 2, 1, 2, 1]


# -- end_of_dataloader and remainder -----------------------------------------------------------
@pytest.mark.parametrize(
    "size,batch_size,n", [(9, 5, 2), (11, 5, 2), (20, 5, 2), (7, 2, 3), (1, 4, 2)]
)
def test_end_of_dataloader_and_remainder(size, batch_size, n):
    seen = []
    loader = prepare_data_loader(
        DataLoader(range(size), batch_size=batch_size), num_processes=n, process_index=0
    )
    state = GradientState()
    for _ in loader:
        seen.append((state.end_of_dataloader, state.remainder, state.active_dataloader is loader))
    assert [end for end, _, _ in seen] == [False] * (len(seen) - 1) + [True]
    # real samples in the last global batch of n * batch_size (0: the dataset fills it)
    assert {remainder for _, remainder, _ in seen} == {size % (n * batch_size)}
    assert all(active for _, _, active in seen)
    assert state.active_dataloader is None and not state.in_dataloader


def test_remainder_of_iterable_without_length_is_counted():
    loader = prepare_data_loader(
        DataLoader(Stream(11), batch_size=2), num_processes=3, process_index=1
    )
    state = GradientState()
    remainders = [state.remainder for _ in loader]
    assert remainders[-1] == 11 % 6


def test_remainder_with_drop_last_is_unknown_but_nothing_is_padded():
    loader = prepare_data_loader(
        DataLoader(range(9), batch_size=2, drop_last=True), num_processes=2, process_index=0
    )
    state = GradientState()
    assert [state.remainder for _ in loader] == [-1, -1]
    assert loader._pads_last_batch is False


def test_total_batch_size_and_length():
    whole = prepare_data_loader(
        DataLoader(range(10), batch_size=3), num_processes=2, process_index=0
    )
    split = prepare_data_loader(
        DataLoader(range(10), batch_size=4), num_processes=2, process_index=0, split_batches=True
    )
    stream = prepare_data_loader(
        DataLoader(Stream(10), batch_size=3), num_processes=2, process_index=0
    )
    assert (whole.total_batch_size, split.total_batch_size, stream.total_batch_size) == (6, 4, 6)
    assert whole.total_dataset_length == 10


def test_nested_batches_keep_their_structure():
    data = [{"x": torch.tensor([i, i]), "y": i} for i in range(5)]
    loader = prepare_data_loader(DataLoader(data, batch_size=2), num_processes=2, process_index=1)
    batches = list(loader)
    assert [b["y"].tolist() for b in batches] == [[2, 3], [1, 2]]  # stream 0..4, 0, 1, 2
    assert batches[0]["x"].shape == (2, 2)
