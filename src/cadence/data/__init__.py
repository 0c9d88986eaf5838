"""Sharded data loading: each process gets its share of every epoch, resumable mid-epoch.

`prepare_data_loader` rebuilds a user's DataLoader as a DataLoaderShard (each process reads its own
batches) or a DataLoaderDispatcher (the main process reads and sends slices); `skip_first_batches`
starts an epoch a number of batches in; `gather_for_metrics` drops the samples repeated to even out
the last batch.
"""

from .batches import (
    TensorInformation,
    find_batch_size,
    get_data_structure,
    ignorant_find_batch_size,
    initialize_tensors,
    slice_tensors,
)
from .dispatch import DataLoaderDispatcher
from .loaders import DataLoaderAdapter, DataLoaderShard, DataLoaderStateMixin, SkipDataLoader
from .metrics import gather_for_metrics
from .prepare import prepare_data_loader
from .samplers import SeedableRandomSampler, SkipBatchSampler, get_sampler
from .sharding import BatchSamplerShard, IterableDatasetShard
from .skip import skip_first_batches

__all__ = [
    "BatchSamplerShard",
    "DataLoaderAdapter",
    "DataLoaderDispatcher",
    "DataLoaderShard",
    "DataLoaderStateMixin",
    "IterableDatasetShard",
    "SeedableRandomSampler",
    "SkipBatchSampler",
    "SkipDataLoader",
    "TensorInformation",
    "find_batch_size",
    "gather_for_metrics",
    "get_data_structure",
    "get_sampler",
    "ignorant_find_batch_size",
    "initialize_tensors",
    "prepare_data_loader",
    "skip_first_batches",
    "slice_tensors",
]
