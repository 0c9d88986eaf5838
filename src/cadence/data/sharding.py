"""Which samples each process gets: sharding a batch sampler or an iterable dataset between processes.

Vocabulary used below: the *source* yields batches of sample indices (a batch sampler) or samples (an
iterable dataset); a *round* is the group of `num_processes` consecutive source batches that make one
global step when batches are not split; *padding* re-uses samples from the start of the epoch so that
every process gets the same number of full batches (`even_batches`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from itertools import cycle, islice
from typing import Any

from torch.utils.data import BatchSampler, IterableDataset

from .samplers import epoch_order


def _cycled(items: list[Any], length: int) -> list[Any]:
    """The first `length` items of `items` repeated end to end."""
    return list(islice(cycle(items), length))


class BatchSamplerShard(BatchSampler):
    """The batches of `batch_sampler` that belong to process `process_index` out of `num_processes`.

    Without `split_batches`, process `i` takes source batches `i, i + n, i + 2n, ...`; with it, every
    source batch is cut into `n` equal parts and process `i` takes part `i`. Unless the source drops its
    last incomplete batch, `even_batches` completes the last round with indices from the start of the
    epoch so that all processes get the same number of full batches; without it, the processes simply
    get what is left (some one batch fewer, the last one possibly short).

    `source_skip` (set on a copy by data/elastic.py when an epoch resumes on another number of
    processes) drops the epoch's first source batches before dealing; the padding still comes from
    the start of the whole epoch, as in an epoch that was never interrupted.

    Args:
        batch_sampler (BatchSampler): The sampler of whole batches to deal out.
        num_processes (int): How many processes share the batches (default 1).
        process_index (int): Which of them this one is, from 0 (default 0).
        split_batches (bool): Cut each source batch into `num_processes` parts instead of dealing
            whole batches round-robin; its batch size must then be a multiple of `num_processes`.
        even_batches (bool): Complete the last round with samples from the epoch's start so that
            every process gets as many batches (default True).

    Raises:
        ValueError: `split_batches` with a batch size that `num_processes` does not divide.
    """

    def __init__(
        self,
        batch_sampler: BatchSampler,
        num_processes: int = 1,
        process_index: int = 0,
        split_batches: bool = False,
        even_batches: bool = True,
    ) -> None:
        # BatchSampler.__init__ is not called on purpose: the source does the batching.
        self.batch_sampler = batch_sampler
        self.num_processes = num_processes
        self.process_index = process_index
        self.split_batches = split_batches
        self.even_batches = even_batches
        self.batch_size = getattr(batch_sampler, "batch_size", None)
        self.drop_last = getattr(batch_sampler, "drop_last", False)
        self.source_skip = 0
        if split_batches and (self.batch_size is None or self.batch_size % num_processes != 0):
            raise ValueError(
                f"split_batches=True needs a batch size ({self.batch_size}) that is a round multiple of the "
                f"number of processes ({num_processes}): change the batch size or use "
                "split_batches=False."
            )

    @property
    def total_length(self) -> int:
        """Number of batches of the wrapped sampler, over all the processes."""
        return len(self.batch_sampler)

    @property
    def pads_last_batch(self) -> bool:
        """Whether the last batches of an epoch may repeat samples from its start."""
        return self.even_batches and not self.drop_last and self.num_processes > 1

    def __len__(self) -> int:
        total = len(self.batch_sampler)
        n, rank = self.num_processes, self.process_index
        if self.split_batches:
            if self.even_batches or self.drop_last or total == 0:
                return total
            last = _last_batch_length(self.batch_sampler, total)
            if last is None or last >= self.batch_size:
                return total
            # The short last batch reaches only the processes whose part of it is not empty.
            return total if last > rank * (self.batch_size // n) else total - 1
        rounds, leftover = divmod(total, n)
        if leftover == 0 or self.drop_last:
            return rounds
        if self.even_batches:
            return rounds + 1
        return rounds + 1 if rank < leftover else rounds

    def __iter__(self) -> Iterator[list[Any]]:
        # A generator, so that nothing is drawn from the sampler's RNG before the first batch is asked
        # for (the DataLoader's iterator draws its worker seed first).

        order = epoch_order(self.batch_sampler)
        if order is not None:
            if self.split_batches:
                yield from self._split_order(*order)
            else:
                yield from self._deal_order(*order)
        elif self.split_batches:
            yield from self._split_source_batches()
        else:
            yield from self._deal_source_batches()

    def _is_full(self, batch: list[Any]) -> bool:
        return self.batch_size is None or len(batch) == self.batch_size

    # -- split_batches: every process takes its part of each source batch ------------------------
    def _part_bounds(self) -> tuple[int, int]:
        part = self.batch_size // self.num_processes
        return part * self.process_index, part * (self.process_index + 1)

    def _split_source_batches(self) -> Iterator[list[Any]]:
        start, stop = self._part_bounds()
        first = last = None
        for index, batch in enumerate(self.batch_sampler):
            if first is None:
                first = batch  # the epoch's first batch, skipped or not: the padding source
            if index < self.source_skip:
                continue
            if len(batch) == self.batch_size:
                yield batch[start:stop]
            last = batch
        if self.drop_last or last is None or len(last) >= self.batch_size:
            return
        yield from self._split_last_batch(list(first), list(last))

    def _split_order(self, order: Sequence[int], finish: Callable[[], None]) -> Iterator[list[Any]]:
        """`_split_source_batches` for a standard BatchSampler whose epoch order is known at once."""
        size = self.batch_size
        start, stop = self._part_bounds()
        first = list(order[:size])  # the padding source: the start of the whole epoch
        order = order[self.source_skip * size :]
        full_batches = len(order) // size
        for offset in range(0, full_batches * size, size):
            yield list(order[offset + start : offset + stop])
        finish()
        if self.drop_last or len(order) == full_batches * size:
            return
        yield from self._split_last_batch(first, list(order[full_batches * size :]))

    def _split_last_batch(self, first: list[Any], last: list[Any]) -> Iterator[list[Any]]:
        start, stop = self._part_bounds()
        if not self.even_batches:
            if len(last) > start:
                yield last[start:stop]
            return
        yield (last + _cycled(first, self.batch_size))[start:stop]

    # -- whole batches: process i takes source batches i, i + n, ... -----------------------------
    def _deal_source_batches(self) -> Iterator[list[Any]]:
        n, rank = self.num_processes, self.process_index
        keep_start = not self.drop_last
        epoch_start: list[Any] = []  # the epoch's first round (skipped or not), the padding source
        mine = None  # this process's batch of the current round, held until the round is complete
        last = None
        count = 0  # source batches dealt (after the skipped ones)
        for index, batch in enumerate(self.batch_sampler):
            if keep_start and index < n:
                if self.batch_size is None:
                    epoch_start.append(batch)
                else:
                    epoch_start.extend(batch)
            if index < self.source_skip:
                continue
            count += 1
            position = count - 1
            if position % n == rank:
                mine = batch
            if position % n == n - 1 and self._is_full(batch):
                yield mine
                mine = None
            last = batch
        if self.drop_last or count == 0:
            return
        yield from self._finish_last_round(mine, last, count, epoch_start)

    def _deal_order(self, order: Sequence[int], finish: Callable[[], None]) -> Iterator[list[Any]]:
        """`_deal_source_batches` for a standard BatchSampler whose epoch order is known at once."""
        n, rank, size = self.num_processes, self.process_index, self.batch_size
        epoch_start = list(order[: n * size])  # the padding source: the start of the whole epoch
        order = order[self.source_skip * size :]
        full_batches = len(order) // size
        complete_rounds = full_batches // n
        for position in range(rank, complete_rounds * n, n):
            yield list(order[position * size : (position + 1) * size])
        finish()
        count = full_batches if self.drop_last else -(-len(order) // size)
        if self.drop_last or count == 0:
            return
        position = complete_rounds * n + rank
        mine = list(order[position * size : (position + 1) * size]) if position < count else None
        last = list(order[(count - 1) * size : count * size])
        yield from self._finish_last_round(mine, last, count, epoch_start)

    def _finish_last_round(
        self, mine: list[Any] | None, last: list[Any], count: int, epoch_start: list[Any]
    ) -> Iterator[list[Any]]:
        """After the source ran out: the batches of the incomplete last round, if any."""
        if not self.even_batches:
            if mine:
                yield mine
            return
        if mine is not None and self._is_full(mine):
            yield mine
        yield from self._pad_last_round(epoch_start, last, count)

    def _pad_last_round(self, epoch_start: list[Any], last: list[Any], count: int):
        """Complete the short last batch and the last round with the epoch's first samples."""
        n, rank, size = self.num_processes, self.process_index, self.batch_size
        if self._is_full(last):
            position, pending = count, []
        else:
            position, pending = count - 1, list(last)
        if size is None:
            # Variable-size batches: whole batches from the start of the epoch fill the round.
            pool = _cycled(epoch_start, n)
            cursor = 0
            while position % n != 0:
                if position % n == rank:
                    yield pool[cursor]
                cursor += 1
                position += 1
            return
        pool = _cycled(epoch_start, n * size)
        cursor = 0
        while position % n != 0 or pending:
            needed = size - len(pending)
            if position % n == rank:
                yield pending + pool[cursor : cursor + needed]
            cursor += needed
            pending = []
            position += 1


def _last_batch_length(batch_sampler: Any, total: int) -> int | None:
    """Length of the last batch of a standard BatchSampler, computed without iterating it."""
    if type(batch_sampler) is not BatchSampler:
        return None
    try:
        samples = len(batch_sampler.sampler)
    except TypeError:
        return None
    return samples - (total - 1) * batch_sampler.batch_size


class IterableDatasetShard(IterableDataset):
    """The samples of an iterable dataset that belong to one process.

    The stream is cut into global batches of `batch_size` (split_batches) or `batch_size * num_processes`
    samples; process `i` takes the `i`-th slice of each. Unless `drop_last`, the last incomplete global
    batch is completed with samples from the first one. Every process reads the whole stream.

    Args:
        dataset (IterableDataset): The stream of samples to share.
        batch_size (int): The batch size of each process, or the global one with `split_batches`
            (default 1).
        drop_last (bool): Drop the last incomplete global batch instead of completing it (default
            False).
        num_processes (int): How many processes share the stream (default 1).
        process_index (int): Which of them this one is, from 0 (default 0).
        split_batches (bool): `batch_size` is the global batch size, cut into `num_processes` parts.

    Raises:
        ValueError: `split_batches` with a batch size that `num_processes` does not divide.
    """

    def __init__(
        self,
        dataset: IterableDataset,
        batch_size: int = 1,
        drop_last: bool = False,
        num_processes: int = 1,
        process_index: int = 0,
        split_batches: bool = False,
    ) -> None:
        if split_batches and batch_size > 1 and batch_size % num_processes != 0:
            raise ValueError(
                f"split_batches=True needs a batch size ({batch_size}) that is a round multiple of the number "
                f"of processes ({num_processes}): change the batch size or use split_batches=False."
            )
        self.dataset = dataset
        self.batch_size = batch_size
        self.drop_last = drop_last
        self.num_processes = num_processes
        self.process_index = process_index
        self.split_batches = split_batches
        # Samples read from the source in the last complete pass (None until one finishes).
        self.samples_seen: int | None = None

    @property
    def global_batch_size(self) -> int:
        """Number of samples in one step summed over all the processes."""
        return self.batch_size if self.split_batches else self.batch_size * self.num_processes

    @property
    def process_batch_size(self) -> int:
        """Number of samples this process gets in one step."""
        if self.split_batches:
            return self.batch_size // self.num_processes
        return self.batch_size

    def set_epoch(self, epoch: int) -> None:
        """Set the epoch, passing it on to the dataset when it supports it.

        Args:
            epoch (int): The epoch number.
        """
        self.epoch = epoch
        if hasattr(self.dataset, "set_epoch"):
            self.dataset.set_epoch(epoch)

    def __len__(self) -> int:
        total = len(self.dataset)  # a dataset without length raises its own TypeError
        rounds = (
            total // self.global_batch_size
            if self.drop_last
            else math.ceil(total / self.global_batch_size)
        )
        return rounds * self.process_batch_size

    def __iter__(self) -> Iterator[Any]:
        generator = getattr(self.dataset, "generator", None)
        if not hasattr(self.dataset, "set_epoch") and _is_torch_generator(generator):
            generator.manual_seed(getattr(self, "epoch", 0))
        size = self.global_batch_size
        start = self.process_index * self.process_batch_size
        stop = start + self.process_batch_size
        self.samples_seen = None
        seen = 0
        first: list[Any] | None = None
        current: list[Any] = []
        for sample in self.dataset:
            current.append(sample)
            if len(current) == size:
                seen += size
                yield from current[start:stop]
                if first is None:
                    first = current
                current = []
        seen += len(current)
        self.samples_seen = seen
        if self.drop_last or not current:
            return
        completed = current + _cycled(first if first is not None else current, size - len(current))
        yield from completed[start:stop]


def _is_torch_generator(value: Any) -> bool:
    import torch

    return isinstance(value, torch.Generator)
