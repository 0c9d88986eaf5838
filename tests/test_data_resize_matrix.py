"""Every combination of a data position saved on N processes and resumed on M (issue 32).

In one process, against the prepared loader and sampler objects, as each rank of a launch builds
them (`prepare_data_loader` with that rank's coordinates, after the script's `set_seed`): saved on
N in {1, 2, 3}, resumed on M in {1, 2, 3, 4}; the default shuffled RandomSampler, a sequential
loader, the seedable sampler and a user batch sampler (its own class: the sharding walks it batch by
batch); even_batches, drop_last and split_batches on and off; saved mid-epoch, inside the loop at
the epoch's last step, and between epochs. Gradient accumulation does not enter the loader's
position; what it changes is where a save happens: "window" saves after 4 steps, inside the second
window of an accumulation of 3 (the real launches of test_elastic_resize.py run the counter too).

The resumed epoch must be the rest of the saved epoch's order, cut the way M processes cut an epoch:
nothing repeated but the padding of even_batches (from the epoch's first samples, as a fresh epoch on
M pads), nothing left out but the tail that drop_last drops; the loader's `remainder` (how
gather_for_metrics drops that padding) counts the real samples of its last step. The epoch after it is a whole epoch on
M, in the order the saved run would have drawn next wherever a generator carries that order (a
sequential loader, the seedable sampler, a run saved on several processes, a resume on one). A run
saved on one process shuffled with torch's global generator, which processes do not share: on M > 1
the next epochs follow the resuming loader's shared generator (every rank alike).
"""

from __future__ import annotations

import functools
import io
import itertools

import pytest
import torch
from torch.utils.data import BatchSampler, DataLoader, RandomSampler

from cadence.data import prepare_data_loader

SIZE = 61  # a short last batch with every batch size below
SPLIT_BATCH = 12  # split_batches: the global batch, cut into 12 // M parts on M in {1, 2, 3, 4}
BATCH = 3  # without split_batches: each process's batch
KINDS = ("shuffled", "sequential", "seedable", "batch_sampler")
SAVE_POINTS = {
    "mid": 2,
    "window": 4,
    "last": None,
    "between": None,
}  # steps before a mid-epoch save


class SortedBatches(BatchSampler):
    """A user's batch sampler: the batches of a BatchSampler, each sorted (like a bucketing one)."""

    def __iter__(self):
        for batch in super().__iter__():
            yield sorted(batch)


def user_loader(kind: str, drop_last: bool, batch: int) -> DataLoader:
    data = list(range(SIZE))
    if kind == "sequential":
        return DataLoader(data, batch_size=batch, drop_last=drop_last)
    if kind == "batch_sampler":
        return DataLoader(data, batch_sampler=SortedBatches(RandomSampler(data), batch, drop_last))
    return DataLoader(data, batch_size=batch, shuffle=True, drop_last=drop_last)


def build(world: int, rank: int, kind: str, even: bool, drop_last: bool, split: bool):
    # The script's set_seed: every process draws the same generators (the CPU's generator is the
    # only one a loader draws from; torch.manual_seed would also queue CUDA's, which costs here).
    torch.default_generator.manual_seed(0)
    return prepare_data_loader(
        user_loader(kind, drop_last, SPLIT_BATCH if split else BATCH),
        num_processes=world,
        process_index=rank,
        rng_types=["generator"],
        split_batches=split,
        even_batches=even,
        use_seedable_sampler=kind == "seedable",
    )


def through_file(state):
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=True)


def global_order(per_rank: list[list[list[int]]]) -> list[int]:
    """The samples of one epoch over all ranks, in the order of the source batches they came from
    (round by round without split_batches, part by part of each batch with it)."""
    order: list[int] = []
    for step in itertools.zip_longest(*per_rank):
        for batch in step:
            order += batch or []
    return order


def one_epoch(loaders) -> list[int]:
    return global_order([[batch.tolist() for batch in loader] for loader in loaders])


def trained(rest: list[int], start: list[int], world, even, drop_last, split) -> list[int]:
    """What `world` processes train of `rest` (an epoch's order, or what is left of it), by the
    documented rules: batches of the source batch size, dealt round by round (whole batches) or cut
    (split_batches); drop_last drops a short last batch and, dealt, an incomplete last round;
    even_batches completes the last step with the first samples of the epoch's order `start`."""
    size = SPLIT_BATCH if split else BATCH
    step = size if split else world * size
    if drop_last:
        kept = len(rest) // size * size
        return list(rest[: kept if split else kept // step * step])
    if not even or world == 1:  # one process never pads
        return list(rest)
    return list(rest) + list(itertools.islice(itertools.cycle(start[:step]), -len(rest) % step))


@functools.cache
def uninterrupted_orders(world: int, kind: str, split: bool) -> list[list[int]]:
    """The order of epochs 0 and 1 of an uninterrupted run on `world` processes (no sample dropped,
    padding removed): what a position must replay."""
    loaders = [build(world, r, kind, True, False, split) for r in range(world)]
    return [one_epoch(loaders)[:SIZE] for _ in range(2)]


def saved_run(kind, saved, even, drop_last, split, at):
    """Train on `saved` processes until the save point: the samples trained (global order) and each
    rank's position, through a file as save_state writes it."""
    loaders = [build(saved, r, kind, even, drop_last, split) for r in range(saved)]
    if at == "between":
        before = one_epoch(loaders)
        return before, [through_file(loader.state_dict()) for loader in loaders]
    iterators = [iter(loader) for loader in loaders]
    per_rank: list[list[list[int]]] = [[] for _ in loaders]
    for step in range(1, 10 * SIZE):  # bounded: an epoch has at most SIZE steps
        batches = [next(iterator, None) for iterator in iterators]
        for rank, batch in enumerate(batches):
            if batch is not None:
                per_rank[rank].append(batch.tolist())
        if step == SAVE_POINTS[at]:
            break
        # The epoch's last step every rank takes (without even_batches a rank may have one more
        # batch, which is then not yet handed out): saved inside the loop.
        if at == "last" and any(loader.end_of_dataloader for loader in loaders):
            break
    return global_order(per_rank), [through_file(loader.state_dict()) for loader in loaders]


def assert_whole_epoch(got: list[int], world, even, drop_last, split) -> None:
    """`got` is a whole epoch on `world` processes of some order of the dataset."""
    real = len(trained(list(range(SIZE)), [], world, False, drop_last, split))
    assert len(set(got[:real])) == real and set(got) <= set(range(SIZE)), got
    if not drop_last:
        assert got == trained(got[:SIZE], got, world, even, drop_last, split)


COMBINATIONS = list(
    itertools.product(
        KINDS,
        (1, 2, 3),  # saved on
        (1, 2, 3, 4),  # resumed on
        (True, False),  # even_batches
        (True, False),  # drop_last
        (True, False),  # split_batches
        SAVE_POINTS,
    )
)


@pytest.mark.parametrize(
    "kind, saved, resumed, even, drop_last, split, at",
    COMBINATIONS,
    ids=[
        f"{kind}-{n}to{m}-{'even' if even else 'uneven'}-{'drop' if drop else 'keep'}-"
        f"{'split' if split else 'whole'}-{at}"
        for kind, n, m, even, drop, split, at in COMBINATIONS
    ],
)
def test_saved_on_n_resumed_on_m(kind, saved, resumed, even, drop_last, split, at):
    layout = (even, drop_last, split)
    order, next_order = uninterrupted_orders(saved, kind, split)
    assert sorted(order) == list(range(SIZE))
    before, states = saved_run(kind, saved, even, drop_last, split, at)
    rng = torch.get_rng_state()  # load_state puts the global RNG back where the save left it

    loaders = [build(resumed, r, kind, even, drop_last, split) for r in range(resumed)]
    torch.rand(3)  # whatever the resumed script drew before loading
    torch.set_rng_state(rng)
    for rank, loader in enumerate(loaders):
        # What load_state gives each rank: its own position, rank 0's to a rank the run had not.
        loader.load_state_dict(states[rank] if rank < saved else states[0])
    rest = one_epoch(loaders)
    remainder = loaders[0].remainder  # real samples of the last step (the rest is padding)
    following = one_epoch(loaders)

    # The order the saved run would draw next, where a generator the processes share carries it.
    carried = kind in ("sequential", "seedable") or saved > 1 or resumed == 1
    if at == "between":
        assert before == trained(order, order, saved, *layout)
        following, rest = rest, []
    else:
        done = min(len(before), SIZE)  # samples of the order trained before the save
        assert before == trained(order[:done], order, saved, even, False, split) or (
            before == trained(order, order, saved, *layout)  # saved after the epoch's last step
        )
        assert rest == trained(order[done:], order, resumed, *layout), "the rest of the epoch"
        if saved != resumed and not drop_last:
            # gather_for_metrics drops the padding by this count: the real samples of the last step
            step = SPLIT_BATCH if split else resumed * BATCH
            assert remainder == len(order[done:]) % step
    if carried:
        assert following == trained(next_order, next_order, resumed, *layout), "the next epoch"
    else:
        assert_whole_epoch(following, resumed, *layout)


class VariableBatches(BatchSampler):
    """A user's batch sampler with batches of 1, 2, 3, 1, 2, 3, ... samples and no batch_size."""

    def __init__(self, size: int) -> None:
        self.size = size

    def __iter__(self):
        start, length = 0, 1
        while start < self.size:
            yield list(range(start, min(start + length, self.size)))
            start, length = start + length, length % 3 + 1

    def __len__(self) -> int:
        return len(list(iter(self)))


@pytest.mark.parametrize("saved, resumed", [(1, 2), (2, 3), (3, 1)])
def test_a_batch_sampler_without_batch_size_is_refused_on_another_number(saved, resumed):
    def variable(world, rank):
        loader = DataLoader(list(range(SIZE)), batch_sampler=VariableBatches(SIZE))
        return prepare_data_loader(loader, num_processes=world, process_index=rank)

    loaders = [variable(saved, r) for r in range(saved)]
    iterators = [iter(loader) for loader in loaders]
    [next(iterator) for iterator in iterators]
    state = through_file(loaders[0].state_dict())
    fresh = variable(resumed, 0)
    with pytest.raises(
        ValueError, match=f"saved mid-epoch on {saved} process.*no fixed batch_size"
    ):
        fresh.load_state_dict(state)  # refused when loading, before any batch is handed out
    # On the number of processes that saved it, the same state resumes.
    same = variable(saved, 0)
    same.load_state_dict(state)
    assert [b.tolist() for b in same][0] == [b.tolist() for b in variable(saved, 0)][1]


@pytest.mark.parametrize("resumed", [2, 3])
def test_a_one_process_position_from_before_the_global_order_flag_resumes_exactly(resumed):
    # A position saved on one process by the Cadence of issue 24 has the global generator's state
    # but does not say the order came from it: naming no sampler generator says it.
    order, _ = uninterrupted_orders(1, "shuffled", False)
    before, states = saved_run("shuffled", 1, True, False, False, "mid")
    assert states[0].pop("order_from_global_rng") is True
    loaders = [build(resumed, r, "shuffled", True, False, False) for r in range(resumed)]
    for loader in loaders:
        loader.load_state_dict(states[0])
    done = len(before)
    assert one_epoch(loaders) == trained(order[done:], order, resumed, True, False, False)
