"""Samplers: a random sampler seeded by (seed + epoch), and batch samplers that skip batches."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from functools import cache
from itertools import islice
from typing import Any

import torch
from torch.utils.data import BatchSampler, RandomSampler, SequentialSampler


def default_generator_device() -> torch.device | str:
    """The device for new random generators: torch's default device, else the CPU."""
    get_default_device = getattr(torch, "get_default_device", None)
    return get_default_device() if get_default_device is not None else "cpu"


class SeedableRandomSampler(RandomSampler):
    """A RandomSampler whose order depends only on `initial_seed + epoch`.

    The same seed gives the same order on every process and in every run; `set_epoch` (called by the
    prepared dataloader at each iteration) changes the order from one epoch to the next.

    Args:
        *args: Passed to `torch.utils.data.RandomSampler`, the data source first.
        data_seed (int | None): The seed of the shuffle; None takes torch's initial seed.
        **kwargs: Any other argument of `RandomSampler` (replacement, num_samples, generator).
    """

    def __init__(self, *args: Any, data_seed: int | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.initial_seed = data_seed if data_seed is not None else torch.random.initial_seed()
        self.epoch = 0
        if self.generator is None:  # created now (not at the first epoch) so a saved state finds it
            self.generator = torch.Generator(device=default_generator_device())

    def __iter__(self) -> Iterator[int]:
        self.seeded_generator()
        yield from super().__iter__()
        self.set_epoch(self.epoch + 1)

    def seeded_generator(self) -> torch.Generator:
        """The generator, seeded for the current epoch."""
        if self.generator is None:
            self.generator = torch.Generator(device=default_generator_device())
        self.generator.manual_seed(self.initial_seed + self.epoch)
        return self.generator

    def set_epoch(self, epoch: int) -> None:
        """Set the epoch, which is mixed into the seed of the shuffle.

        Args:
            epoch (int): The epoch number; the next order is drawn with seed `initial_seed + epoch`.
        """
        self.epoch = epoch


class SkipBatchSampler(BatchSampler):
    """The batches of `batch_sampler` after its first `skip_batches`.

    Args:
        batch_sampler (Any): The batch sampler to read (its other attributes are passed through).
        skip_batches (int): How many of its first batches to leave out, at every iteration (default 0).
    """

    def __init__(self, batch_sampler: Any, skip_batches: int = 0) -> None:
        # BatchSampler.__init__ is not called on purpose: the wrapped sampler does the batching.
        self.batch_sampler = batch_sampler
        self.skip_batches = skip_batches

    def __iter__(self) -> Iterator[Any]:
        return islice(iter(self.batch_sampler), self.skip_batches, None)

    def __getattr__(self, name: str) -> Any:
        # batch_size, drop_last, split_batches, num_processes... are those of the wrapped sampler.
        if name == "batch_sampler":
            raise AttributeError(name)
        return getattr(self.batch_sampler, name)

    @property
    def total_length(self) -> int:
        """Number of batches of the wrapped sampler, skipped ones included."""
        return len(self.batch_sampler)

    def __len__(self) -> int:
        return max(len(self.batch_sampler) - self.skip_batches, 0)


class ResumeSkip:
    """Index sampler of the iterator that resumes an epoch: drops the batches already seen.

    The loader sets `skip` to 0 once its iterator is built (which may call iter() more than once).
    """

    def __init__(self, index_sampler: Any, skip: int) -> None:
        self.index_sampler = index_sampler
        self.skip = skip

    def __iter__(self) -> Iterator[Any]:
        return islice(iter(self.index_sampler), self.skip, None)

    def __len__(self) -> int:
        return len(self.index_sampler)


def get_sampler(dataloader: Any) -> Any:
    """The sampler of indices behind a dataloader, looking through batch-sampler wrappers.

    Args:
        dataloader (Any): A `torch.utils.data.DataLoader`, prepared or not.

    Returns:
        The sampler that orders the dataset's indices, or None when there is none (an iterable dataset).
    """
    holder = (
        dataloader.sampler
        if isinstance(dataloader.sampler, BatchSampler)
        else dataloader.batch_sampler
    )
    for _ in range(8):  # wrappers nest a few levels at most
        if holder is None:
            return None
        sampler = getattr(holder, "sampler", None)
        if sampler is not None:
            return sampler
        holder = getattr(holder, "batch_sampler", None)
    return None


def draws_from_global_rng(sampler: Any) -> bool:
    """Whether `sampler` shuffles with torch's global generator: a random sampler without a
    generator of its own (a RandomSampler on one process, where preparation gives it none)."""
    return sampler is not None and hasattr(sampler, "generator") and sampler.generator is None


def _nothing() -> None:
    return None


@cache
def _randperm_order_matches_random_sampler() -> bool:
    """Whether RandomSampler still draws one permutation per epoch plus one when exhausted."""
    expected_generator = torch.Generator().manual_seed(1234)
    expected = list(RandomSampler(range(7), generator=expected_generator))
    generator = torch.Generator().manual_seed(1234)
    order = torch.randperm(7, generator=generator).tolist()
    torch.randperm(7, generator=generator)
    return order == expected and torch.equal(generator.get_state(), expected_generator.get_state())


def epoch_order(batch_sampler: Any) -> tuple[Sequence[int], Callable[[], None]] | None:
    """The whole epoch's indices of a standard BatchSampler as one sequence, when they can be drawn
    at once exactly as its sampler would draw them one by one (None otherwise).

    The second value finishes the epoch as the sampler does once exhausted (a RandomSampler draws one
    more permutation). Sharding then slices this sequence instead of walking every index of every
    process through the sampler's generator, which costs more than the plain DistributedSampler.
    """
    if type(batch_sampler) is not BatchSampler:
        return None
    sampler = batch_sampler.sampler
    kind = type(sampler)
    if kind is SequentialSampler:
        return range(len(sampler.data_source)), _nothing
    if kind not in (RandomSampler, SeedableRandomSampler) or sampler.replacement:
        return None
    size = len(sampler.data_source)
    if sampler.num_samples != size or size == 0 or not _randperm_order_matches_random_sampler():
        return None
    if kind is SeedableRandomSampler:
        generator = sampler.seeded_generator()
    elif sampler.generator is not None:
        generator = sampler.generator
    else:
        return None
    order = torch.randperm(size, generator=generator).tolist()

    def finish() -> None:
        torch.randperm(size, generator=generator)
        if kind is SeedableRandomSampler:
            sampler.set_epoch(sampler.epoch + 1)

    return order, finish
