"""What the exactly-once cursor reads from the user's DataLoader, and the DataLoaders it refuses.

The cursor re-cuts each epoch's order over whichever ranks take part in a step, so it needs that
order as a permutation of sample positions drawn from known generators, and a fixed number of
samples per rank per step. A DataLoader built the usual ways gives both: `batch_size` with
`shuffle=True` (with or without a generator) or `shuffle=False`, `drop_last` either way, or torch's
own `BatchSampler` of a fixed size over a `RandomSampler` or `SequentialSampler`. What cannot be cut
exactly (a variable-size batch sampler, a custom or weighted sampler, an `IterableDataset`) is
refused with what to use instead.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

# Where the refusals point.
_DOCS = "docs: Training through failures, 'Every sample exactly once'"


@dataclass(frozen=True)
class LoaderSource:
    """The parts of a DataLoader the cursor draws from.

    Attributes:
        dataset: the map-style dataset (indexed by position).
        batch_size: samples per rank per micro-step.
        shuffle: a random order each epoch (else the dataset's order).
        drop_last: an epoch ends when fewer samples remain than a whole step (else the tail is
            shared out).
        sampler_generator: the generator the epoch's permutation is drawn from (None: sequential).
        loader_generator: the DataLoader's own generator (its workers' base seed), if it has one.
        collate_fn: how samples become a batch.
        own_generator: the sampler had no generator and the cursor made one (its state travels with
            the heal, so every group draws the order of the first quorum's primary).
    """

    dataset: Any
    batch_size: int
    shuffle: bool
    drop_last: bool
    sampler_generator: torch.Generator | None
    loader_generator: torch.Generator | None
    collate_fn: Any
    own_generator: bool = False


def read_source(data_loader: Any) -> LoaderSource:
    """The cursor's view of `data_loader`, or a ValueError that says what to use instead.

    Example:
        >>> import torch
        >>> loader = torch.utils.data.DataLoader(torch.arange(8), batch_size=2, shuffle=True)
        >>> source = read_source(loader)
        >>> source.batch_size, source.shuffle, source.own_generator
        (2, True, True)
    """
    dataset = getattr(data_loader, "dataset", None)
    if isinstance(dataset, torch.utils.data.IterableDataset):
        raise ValueError(
            f"fault tolerance cuts each epoch by sample position, and an IterableDataset "
            f"({type(dataset).__name__}) has none: a step lost with a replica group could not be "
            "drawn again exactly. Use a map-style Dataset (with __getitem__ and __len__), or train "
            f"without --fault_tolerance ({_DOCS})"
        )
    batch_size = getattr(data_loader, "batch_size", None)
    sampler = getattr(data_loader, "sampler", None)
    drop_last = bool(getattr(data_loader, "drop_last", False))
    if batch_size is None:
        batch_sampler = getattr(data_loader, "batch_sampler", None)
        if type(batch_sampler) is not torch.utils.data.BatchSampler:
            raise ValueError(
                f"fault tolerance re-cuts every step over the replica groups that take part, so "
                f"it needs batches of one fixed size; a {type(batch_sampler).__name__} as "
                "batch_sampler may vary them. Pass batch_size=... (with shuffle=True or False) to "
                "the DataLoader, or torch.utils.data.BatchSampler(sampler, batch_size, drop_last) "
                f"over a RandomSampler or SequentialSampler ({_DOCS})"
            )
        batch_size = batch_sampler.batch_size
        sampler = batch_sampler.sampler
        drop_last = bool(batch_sampler.drop_last)
    shuffle = isinstance(sampler, torch.utils.data.RandomSampler)
    if not shuffle and not isinstance(sampler, torch.utils.data.SequentialSampler):
        raise ValueError(
            f"fault tolerance cuts the epoch's order itself: a DataLoader with a "
            f"{type(sampler).__name__} cannot be re-cut exactly; use shuffle=True or "
            f"shuffle=False (a RandomSampler or SequentialSampler) ({_DOCS})"
        )
    if shuffle and (sampler.replacement or sampler._num_samples is not None):
        raise ValueError(
            "fault tolerance draws each epoch as a permutation of the dataset: a RandomSampler "
            "with replacement=True or num_samples=... cannot be re-cut exactly; use "
            f"shuffle=True without them ({_DOCS})"
        )
    sampler_generator = getattr(sampler, "generator", None) if shuffle else None
    own = shuffle and sampler_generator is None
    if own:
        # torch would seed a fresh generator from the global RNG at each epoch; the cursor keeps
        # one, seeded from the process's seed (set_seed's), and the first quorum's heal hands the
        # primary group's state to every other group: the job agrees on one order.
        sampler_generator = torch.Generator().manual_seed(torch.initial_seed())
    return LoaderSource(
        dataset=dataset,
        batch_size=int(batch_size),
        shuffle=shuffle,
        drop_last=drop_last,
        sampler_generator=sampler_generator,
        loader_generator=getattr(data_loader, "generator", None),
        collate_fn=data_loader.collate_fn,
        own_generator=own,
    )
