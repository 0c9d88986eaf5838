"""skip_first_batches: a dataloader that starts its (first) epoch a number of batches in."""

from __future__ import annotations

from torch.utils.data import BatchSampler, DataLoader, IterableDataset

from .dispatch import DataLoaderDispatcher
from .loaders import DataLoaderShard, SkipDataLoader
from .prepare import loader_arguments
from .samplers import SkipBatchSampler


def skip_first_batches(dataloader: DataLoader, num_batches: int = 0) -> DataLoader:
    """A new dataloader like `dataloader` that starts after its first `num_batches` batches.

    Use it to resume in the middle of an epoch. Batches of a map-style dataset are skipped by their
    indices (nothing is loaded); those of an iterable dataset are read and dropped. For a prepared
    dataloader the result shares its position, so the original's `state_dict()` follows the progress.
    The skip applies to one pass: iterate the original dataloader for the next epoch.

    Args:
        dataloader (torch.utils.data.DataLoader): A dataloader, prepared or not.
        num_batches (int): How many batches to skip (default 0).

    Returns:
        torch.utils.data.DataLoader: The skipping dataloader.

    Raises:
        TypeError: `dataloader` is not a DataLoader.
        ValueError: `num_batches` is negative or not an integer.

    Example:
        >>> import torch
        >>> from cadence import skip_first_batches
        >>> loader = torch.utils.data.DataLoader(torch.arange(6), batch_size=2)
        >>> [batch.tolist() for batch in skip_first_batches(loader, num_batches=1)]
        [[2, 3], [4, 5]]
    """
    if not isinstance(dataloader, DataLoader):
        raise TypeError(
            f"skip_first_batches needs a torch.utils.data.DataLoader, got {type(dataloader).__name__}."
        )
    if isinstance(num_batches, bool) or not isinstance(num_batches, int) or num_batches < 0:
        raise ValueError(f"num_batches must be a non-negative integer, got {num_batches!r}.")
    dataset = dataloader.dataset
    is_iterable = isinstance(dataset, IterableDataset)
    sampler_is_batch_sampler = isinstance(dataloader.sampler, BatchSampler)
    kwargs = loader_arguments(dataloader)
    skipping_sampler = None
    if is_iterable:
        kwargs.update(drop_last=dataloader.drop_last, batch_size=dataloader.batch_size)
    else:
        source = dataloader.sampler if sampler_is_batch_sampler else dataloader.batch_sampler
        skipping_sampler = SkipBatchSampler(source, skip_batches=num_batches)

    if isinstance(dataloader, DataLoaderDispatcher):
        # Dispatched batches are counted as the processes see them, and skipped on the main process.
        kwargs.pop("generator", None)
        if not is_iterable:
            if sampler_is_batch_sampler:
                kwargs.update(sampler=dataloader.sampler, batch_size=dataloader.batch_size)
            else:
                kwargs["batch_sampler"] = dataloader.batch_sampler
        skipped = DataLoaderDispatcher(
            dataset,
            split_batches=dataloader.split_batches,
            skip_batches=num_batches,
            _drop_last=dataloader._drop_last,
            _non_blocking=dataloader._non_blocking,
            slice_fn=dataloader.slice_fn,
            torch_device_mesh=dataloader.torch_device_mesh,
            use_stateful_dataloader=dataloader.use_stateful_dataloader,
            iteration=dataloader.iteration,
            **kwargs,
        )
    elif isinstance(dataloader, DataLoaderShard):
        if is_iterable:
            kwargs["skip_batches"] = num_batches
        elif sampler_is_batch_sampler:
            kwargs.update(sampler=skipping_sampler, batch_size=dataloader.batch_size)
        else:
            kwargs["batch_sampler"] = skipping_sampler
        skipped = DataLoaderShard(
            dataset,
            device=dataloader.device,
            rng_types=dataloader.rng_types,
            synchronized_generator=dataloader.synchronized_generator,
            _drop_last=dataloader._drop_last,
            _non_blocking=dataloader._non_blocking,
            torch_device_mesh=dataloader.torch_device_mesh,
            use_stateful_dataloader=dataloader.use_stateful_dataloader,
            iteration=dataloader.iteration,
            **kwargs,
        )
    elif is_iterable:
        return SkipDataLoader(dataset, skip_batches=num_batches, **kwargs)
    else:
        return DataLoader(dataset, batch_sampler=skipping_sampler, **kwargs)
    skipped._position = dataloader._position
    return skipped
