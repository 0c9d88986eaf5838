"""Prepared dataloaders in one process: skipping, seeded shuffling, epochs, devices, options, errors."""

from __future__ import annotations

import sys

import pytest
import torch
from data_model import whole_batches
from torch.utils.data import DataLoader, IterableDataset, SequentialSampler

from cadence.data import (
    DataLoaderDispatcher,
    DataLoaderShard,
    SeedableRandomSampler,
    SkipDataLoader,
    prepare_data_loader,
    skip_first_batches,
)
from cadence.state import GradientState


class Stream(IterableDataset):
    def __init__(self, size: int) -> None:
        self.size = size
        self.epochs: list[int] = []

    def __iter__(self):
        return iter(range(self.size))

    def set_epoch(self, epoch: int) -> None:
        self.epochs.append(epoch)


def batches_of(loader) -> list[list[int]]:
    return [batch.tolist() for batch in loader]


def sharded(dataset, rank=0, n=2, **kwargs):
    loader_keys = ("batch_size", "drop_last", "shuffle", "collate_fn", "num_workers", "timeout")
    options = {k: kwargs.pop(k) for k in list(kwargs) if k not in loader_keys}
    return prepare_data_loader(
        DataLoader(dataset, **kwargs), num_processes=n, process_index=rank, **options
    )


# -- skip_first_batches ------------------------------------------------------------------------
@pytest.mark.parametrize("make", [lambda: range(23), lambda: Stream(23)], ids=["map", "iterable"])
def test_skip_first_batches_of_a_prepared_loader(make):
    for rank in range(2):
        full = batches_of(sharded(make(), rank, batch_size=3))
        loader = sharded(make(), rank, batch_size=3)
        skipped = skip_first_batches(loader, 2)
        assert type(skipped) is type(loader)
        assert batches_of(skipped) == full[2:]
        if not isinstance(loader.dataset, IterableDataset):
            assert len(skipped) == len(full) - 2
        assert batches_of(loader) == full  # the original is unchanged


def test_skip_first_batches_keeps_end_and_remainder():
    loader = skip_first_batches(sharded(range(11), 0, batch_size=3), 1)
    state = GradientState()
    seen = [(state.end_of_dataloader, state.remainder) for _ in loader]
    assert seen == [(True, 11 % 6)]  # two batches per rank, the first skipped


def test_skip_first_batches_of_plain_loaders():
    plain = skip_first_batches(DataLoader(range(10), batch_size=3), 2)
    assert type(plain) is DataLoader
    assert batches_of(plain) == [[6, 7, 8], [9]]
    stream = skip_first_batches(DataLoader(Stream(10), batch_size=3), 2)
    assert isinstance(stream, SkipDataLoader)
    assert batches_of(stream) == [[6, 7, 8], [9]]
    assert len(skip_first_batches(DataLoader(range(10), batch_size=3), 9)) == 0


def test_skip_more_than_there_is():
    assert batches_of(skip_first_batches(sharded(range(10), batch_size=3), 5)) == []


def test_skip_first_batches_rejects_bad_counts():
    with pytest.raises(ValueError, match="non-negative integer"):
        skip_first_batches(DataLoader(range(4)), -1)


def test_skipping_loader_advances_the_original_position():
    loader = sharded(range(20), 0, batch_size=2)
    skipped = skip_first_batches(loader, 2)
    iterator = iter(skipped)
    next(iterator)
    assert loader.state_dict()["batches_yielded"] == 3
    list(iterator)
    assert loader.iteration == 1 and loader.state_dict()["batches_yielded"] == 0


# -- seeded shuffling --------------------------------------------------------------------------
def expected_seeded_order(size, seed, epoch):
    return torch.randperm(size, generator=torch.Generator().manual_seed(seed + epoch)).tolist()


def test_seedable_sampler_order_is_seed_plus_epoch():
    loaders = [
        sharded(
            range(12), rank, batch_size=3, shuffle=True, use_seedable_sampler=True, data_seed=42
        )
        for rank in range(2)
    ]
    assert isinstance(loaders[0].get_sampler(), SeedableRandomSampler)
    for epoch in range(3):
        order = expected_seeded_order(12, 42, epoch)
        for rank, loader in enumerate(loaders):
            assert batches_of(loader) == whole_batches(order, 3, 2, rank)
    assert expected_seeded_order(12, 42, 0) != expected_seeded_order(12, 42, 1)


def test_seedable_sampler_in_one_process_and_set_epoch():
    loader = prepare_data_loader(
        DataLoader(range(10), batch_size=10, shuffle=True), use_seedable_sampler=True, data_seed=7
    )
    loader.set_epoch(4)
    assert batches_of(loader) == [expected_seeded_order(10, 7, 4)]
    assert batches_of(loader) == [expected_seeded_order(10, 7, 5)]


def test_shuffle_order_is_the_same_for_every_rank_built_alike():
    # In one process no generator is synchronised: equal seeds stand in for the broadcast.
    per_rank = []
    for rank in range(2):
        torch.manual_seed(3)
        per_rank.append(batches_of(sharded(range(10), rank, batch_size=5, shuffle=True)))
    assert sorted(per_rank[0][0] + per_rank[1][0]) == list(range(10))


# -- epochs ------------------------------------------------------------------------------------
def test_set_epoch_reaches_the_sampler_and_the_iterable_dataset():
    class RecordingSampler(SequentialSampler):
        def __init__(self, data):
            super().__init__(data)
            self.epochs = []

        def set_epoch(self, epoch):
            self.epochs.append(epoch)

    sampler = RecordingSampler(range(8))
    loader = prepare_data_loader(
        DataLoader(range(8), sampler=sampler, batch_size=2), num_processes=2, process_index=0
    )
    list(loader)
    list(loader)
    loader.set_epoch(7)
    list(loader)
    assert sampler.epochs == [0, 1, 7, 7]
    assert loader.iteration == 8

    stream = Stream(8)
    loader = sharded(stream, 1, batch_size=2)
    list(loader)
    list(loader)
    assert stream.epochs == [0, 1]


# -- devices, options --------------------------------------------------------------------------
def test_batches_go_to_the_device():
    loader = prepare_data_loader(
        DataLoader(range(6), batch_size=2),
        device=torch.device("meta"),
        put_on_device=True,
        num_processes=2,
        process_index=0,
        non_blocking=True,
    )
    assert {batch.device.type for batch in loader} == {"meta"}
    on_cpu = prepare_data_loader(
        DataLoader(range(6), batch_size=2), device="cpu", put_on_device=True
    )
    assert {batch.device.type for batch in on_cpu} == {"cpu"}
    not_moved = prepare_data_loader(DataLoader(range(6), batch_size=2), device="meta")
    assert {batch.device.type for batch in not_moved} == {"cpu"}


def test_loader_options_are_kept():
    def collate(samples):
        return torch.tensor(samples) * 10

    original = DataLoader(range(8), batch_size=2, collate_fn=collate, num_workers=1, timeout=30)
    loader = sharded(range(8), 1, batch_size=2, collate_fn=collate, num_workers=1, timeout=30)
    assert (loader.num_workers, loader.timeout, loader.collate_fn) == (1, 30, collate)
    assert batches_of(loader) == [[20, 30], [60, 70]]
    assert len(batches_of(original)) == 4


def test_dispatch_in_one_process():
    loader = prepare_data_loader(
        DataLoader(Stream(7), batch_size=3), device="cpu", put_on_device=True
    )
    assert isinstance(loader, DataLoaderDispatcher)
    assert batches_of(loader) == [[0, 1, 2], [3, 4, 5], [6]]
    assert (
        len(
            prepare_data_loader(
                DataLoader(range(7), batch_size=3),
                device="cpu",
                dispatch_batches=True,
                put_on_device=True,
            )
        )
        == 3
    )


def test_stateful_dataloader_backend():
    StatefulDataLoader = pytest.importorskip("torchdata.stateful_dataloader").StatefulDataLoader

    loader = sharded(range(10), 1, batch_size=2, use_stateful_dataloader=True)
    assert isinstance(loader, StatefulDataLoader) and isinstance(loader, DataLoaderShard)
    assert batches_of(loader) == whole_batches(list(range(10)), 2, 2, 1)
    skipped = skip_first_batches(loader, 1)
    assert isinstance(skipped, StatefulDataLoader)
    assert batches_of(skipped) == whole_batches(list(range(10)), 2, 2, 1)[1:]


def test_stateful_dataloader_missing_is_a_clear_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "torchdata.stateful_dataloader", None)
    with pytest.raises(ImportError, match="pip install torchdata"):
        sharded(range(10), 0, batch_size=2, use_stateful_dataloader=True)


# -- bad input ---------------------------------------------------------------------------------
def test_bad_input_is_refused_with_a_clear_error():
    with pytest.raises(ValueError, match="multiple of the number of processes"):
        sharded(range(10), batch_size=3, split_batches=True)
    with pytest.raises(ValueError, match="put_on_device=True"):
        prepare_data_loader(DataLoader(range(4)), dispatch_batches=True)
    with pytest.raises(TypeError, match="needs a torch.utils.data.DataLoader"):
        prepare_data_loader(range(4))
    with pytest.raises(ValueError, match="batch_size=None"):
        prepare_data_loader(
            DataLoader(range(4), batch_sampler=[[0, 1], [2, 3]]),
            num_processes=2,
            process_index=0,
            split_batches=True,
        )


def test_rng_types_argument_is_not_modified():
    rng_types = ["generator", "torch"]
    loader = prepare_data_loader(DataLoader(range(4)), rng_types=rng_types)
    assert rng_types == ["generator", "torch"]
    assert loader.rng_types == ["torch"]  # nothing to synchronise in one process
