"""Prepared dataloaders across 2 real gloo processes: RNG synchronisation, dispatch, gather_for_metrics,
seeded sampling and exact resume. Expected values come from tests/data_model.py (the spec's rules)."""

from __future__ import annotations

import warnings

import torch
from data_model import dispatched
from torch.utils.data import DataLoader, IterableDataset

SIZES = [1, 3, 7, 9, 10, 16, 17]


class Stream(IterableDataset):
    def __init__(self, size: int) -> None:
        self.size = size

    def __iter__(self):
        return iter(range(self.size))


class SizedStream(Stream):
    def __len__(self) -> int:
        return self.size


def _prepare(dataloader, **options):
    from cadence.data import prepare_data_loader
    from cadence.state import PartialState

    state = PartialState()
    options.setdefault("rng_types", ["generator"])
    return prepare_data_loader(dataloader, device=state.device, put_on_device=True, **options)


def _rank() -> int:
    from cadence.state import PartialState

    return PartialState().process_index


# -- RNG synchronisation -----------------------------------------------------------------------
def shuffled_epochs(size, epochs=3):
    torch.manual_seed(100 + _rank())  # each process has its own global seed
    loader = _prepare(DataLoader(range(size), batch_size=2, shuffle=True))
    return [[batch.tolist() for batch in loader] for _ in range(epochs)]


def test_shuffling_is_identical_on_all_ranks_and_new_each_epoch(dist_pool):
    rank0, rank1 = dist_pool(2).run(shuffled_epochs, 20)
    orders = []
    for epoch0, epoch1 in zip(rank0, rank1):
        order = [i for pair in zip(epoch0, epoch1) for batch in pair for i in batch]
        assert sorted(order) == list(range(20))  # together the ranks see one permutation
        orders.append(order)
    assert orders[0] != orders[1] != orders[2]
    assert orders[0] != list(range(20))


def test_uneven_shuffled_dataset_pads_from_the_shared_permutation(dist_pool):
    rank0, rank1 = dist_pool(2).run(shuffled_epochs, 7, 1)
    epoch0, epoch1 = rank0[0], rank1[0]
    stream = [i for pair in zip(epoch0, epoch1) for batch in pair for i in batch]
    assert sorted(stream[:7]) == list(range(7)) and stream[7] == stream[0]


# -- dispatch ----------------------------------------------------------------------------------
def dispatch_runs():
    from cadence.data import gather_for_metrics
    from cadence.state import GradientState

    results = {}
    for kind in ("map", "iterable"):
        for size in SIZES:
            for batch_size in (1, 2, 3):
                for split in (False, True):
                    for drop_last in (False, True):
                        bs = batch_size * 2 if split else batch_size
                        data = range(size) if kind == "map" else SizedStream(size)
                        loader = _prepare(
                            DataLoader(data, batch_size=bs, drop_last=drop_last),
                            split_batches=split,
                            dispatch_batches=True,
                        )
                        batches, gathered, ends = [], [], []
                        for batch in loader:
                            batches.append(batch.tolist())
                            ends.append(GradientState().end_of_dataloader)
                            gathered += gather_for_metrics(batch).tolist()
                        results[(kind, size, bs, split, drop_last)] = (
                            batches,
                            gathered,
                            ends,
                            len(loader),
                        )
    return results


def test_dispatch_gives_each_rank_its_slice(dist_pool):
    per_rank = dist_pool(2).run(dispatch_runs, timeout=300)
    for (kind, size, bs, split, drop_last), _ in per_rank[0].items():
        stream = list(range(size))
        for rank in range(2):
            batches, gathered, ends, length = per_rank[rank][(kind, size, bs, split, drop_last)]
            assert batches == dispatched(stream, bs, 2, rank, split, drop_last), (kind, size, bs)
            assert length == len(batches)
            assert ends == [False] * (len(batches) - 1) + [True] * bool(batches)
            if not drop_last:
                assert gathered == stream  # the repeats completing the last batch are dropped


# -- gather_for_metrics ------------------------------------------------------------------------
def spec_example():
    from cadence.data import gather_for_metrics

    loader = _prepare(DataLoader(range(9), batch_size=5))
    batch = next(iter(loader))
    return len(gather_for_metrics(batch))


def spec_example_through_the_accelerator():
    from cadence import Accelerator

    accelerator = Accelerator()
    dataloader = accelerator.prepare(DataLoader(range(9), batch_size=5))
    batch = next(iter(dataloader))
    return len(accelerator.gather_for_metrics(batch))


def test_gather_for_metrics_spec_example(dist_pool):
    assert dist_pool(2).run(spec_example) == [9, 9]
    assert dist_pool(2).run(spec_example_through_the_accelerator) == [9, 9]


def gathered_epochs():
    from cadence.data import gather_for_metrics, skip_first_batches

    results = {}
    for size in SIZES:
        for name, make, options in (
            ("whole", lambda s: DataLoader(range(s), batch_size=2), {}),
            ("split", lambda s: DataLoader(range(s), batch_size=4), {"split_batches": True}),
            (
                "iterable",
                lambda s: DataLoader(Stream(s), batch_size=2),
                {"dispatch_batches": False},
            ),
            (
                "sized-iterable",
                lambda s: DataLoader(SizedStream(s), batch_size=3),
                {"dispatch_batches": False},
            ),
        ):
            loader = _prepare(make(size), **options)
            results[(name, size)] = [
                x for batch in loader for x in gather_for_metrics(batch).tolist()
            ]
            skipped = skip_first_batches(_prepare(make(size), **options), 1)
            results[(name, size, "skip")] = [
                x for batch in skipped for x in gather_for_metrics(batch).tolist()
            ]
            objects = []
            for batch in _prepare(make(size), **options):
                objects += gather_for_metrics([f"sample {i}" for i in batch.tolist()])
            results[(name, size, "objects")] = objects
    return results


def test_gather_for_metrics_drops_exactly_the_repeats(dist_pool):
    rank0, rank1 = dist_pool(2).run(gathered_epochs, timeout=300)
    assert rank0 == rank1
    for key, gathered in rank0.items():
        name, size = key[0], key[1]
        global_batch = 4 if name in ("whole", "split", "iterable") else 6
        if len(key) == 2:
            assert gathered == list(range(size)), key
        elif key[2] == "skip":
            assert gathered == list(range(global_batch, size)), key
        else:
            assert gathered == [f"sample {i}" for i in range(size)], key


class UnsizedBatches:
    """Batches [0, 1], [2, 3], [4] from a batch sampler that does not say its batch size."""

    def __iter__(self):
        yield from ([0, 1], [2, 3], [4])

    def __len__(self):
        return 3


def unknown_length_warns():
    from cadence.data import gather_for_metrics

    loader = _prepare(DataLoader(range(5), batch_sampler=UnsizedBatches()))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        gathered = [x for batch in loader for x in gather_for_metrics(batch.tolist())]
    return gathered, [str(w.message) for w in caught if "gather_for_metrics" in str(w.message)]


def test_gather_for_metrics_warns_when_it_cannot_know(dist_pool):
    (gathered, messages), _ = dist_pool(2).run(unknown_length_warns)
    # Round 2 is [4] on rank 0 and the epoch's first batch again on rank 1: the repeats are kept...
    assert gathered == [0, 1, 2, 3, 4, 0, 1]
    assert len(messages) == 1 and "drop the extra samples yourself" in messages[0]  # ...and said so


# -- seeded sampler ----------------------------------------------------------------------------
def seedable_without_data_seed():
    torch.manual_seed(10 + _rank())  # different torch seeds: the main process's one is used
    loader = _prepare(DataLoader(range(12), batch_size=3, shuffle=True), use_seedable_sampler=True)
    return [[b.tolist() for b in loader] for _ in range(2)]


def test_seedable_sampler_agrees_across_ranks(dist_pool):
    rank0, rank1 = dist_pool(2).run(seedable_without_data_seed)
    for epoch in range(2):
        order = [i for pair in zip(rank0[epoch], rank1[epoch]) for b in pair for i in b]
        assert sorted(order) == list(range(12))
    assert rank0[0] != rank0[1]


# -- exact resume ------------------------------------------------------------------------------
def resume_run(interrupt_at, dispatch=False):
    """Three epochs of a shuffled loader; with `interrupt_at=(epoch, batches)`, the loader is saved
    there and a new one (built as a restarted script would) continues from the loaded state.

    Dispatched, the main process shuffles with torch's global generator (no sampler generator)."""
    import io

    def build():
        torch.manual_seed(0)
        return _prepare(
            DataLoader(range(19), batch_size=2, shuffle=True), dispatch_batches=dispatch
        )

    loader = build()
    epochs = []
    for epoch in range(3):
        batches = []
        for batch in loader:
            batches.append(batch.tolist())
            if interrupt_at == (epoch, len(batches)):
                buffer = io.BytesIO()
                torch.save(loader.state_dict(), buffer)
                rng = torch.get_rng_state()
                loader = build()
                buffer.seek(0)
                torch.set_rng_state(rng)
                loader.load_state_dict(torch.load(buffer, weights_only=True))
                break
        if interrupt_at is not None and interrupt_at[0] == epoch:
            batches += [batch.tolist() for batch in loader]
        epochs.append(batches)
    return epochs


def test_resume_across_processes(dist_pool):
    pool = dist_pool(2)
    for dispatch in (False, True):
        expected = pool.run(resume_run, None, dispatch)
        assert expected[0][0] != expected[0][1] and expected[0][0] != expected[1][0]
        for interrupt_at in ((0, 2), (1, 5), (2, 3)):
            assert pool.run(resume_run, interrupt_at, dispatch) == expected, (
                dispatch,
                interrupt_at,
            )


def dispatched_skip():
    from cadence.data import skip_first_batches

    loader = _prepare(DataLoader(range(13), batch_size=2), dispatch_batches=True)
    skipped = skip_first_batches(loader, 2)
    return [b.tolist() for b in skipped], len(skipped), loader.state_dict()["epoch"]


def test_skip_first_batches_of_a_dispatched_loader(dist_pool):
    results = dist_pool(2).run(dispatched_skip)
    for rank, (batches, length, epoch) in enumerate(results):
        assert batches == dispatched(list(range(13)), 2, 2, rank)[2:]
        assert length == len(batches) and epoch == 1
