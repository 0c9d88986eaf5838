"""prepare_data_loader: rebuild a user's DataLoader so that each process gets its share of the data."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import torch
from torch.utils.data import BatchSampler, DataLoader, IterableDataset, RandomSampler

from ..core.enums import DistributedType, RNGType
from ..core.input_errors import rank_named_errors
from ..plugins.parallelism import mesh_data_parallel_coordinates
from ..runtime.collectives import broadcast_object_list
from ..runtime.state import PartialState
from .dispatch import DataLoaderDispatcher
from .loaders import DataLoaderShard
from .samplers import SeedableRandomSampler, default_generator_device, get_sampler
from .sharding import BatchSamplerShard, IterableDatasetShard

# DataLoader constructor arguments and their defaults (what a rebuilt loader copies from the original).
DATALOADER_DEFAULTS: dict[str, Any] = {
    "batch_size": 1,
    "shuffle": False,
    "sampler": None,
    "batch_sampler": None,
    "num_workers": 0,
    "collate_fn": None,
    "pin_memory": False,
    "drop_last": False,
    "timeout": 0,
    "worker_init_fn": None,
    "multiprocessing_context": None,
    "generator": None,
    "prefetch_factor": 2,
    "persistent_workers": False,
    "pin_memory_device": "",
    "in_order": True,
}
# Decided by the (new) batch sampler rather than copied.
_BATCHING_ARGUMENTS = ("batch_size", "shuffle", "sampler", "batch_sampler", "drop_last")


def loader_arguments(dataloader: DataLoader) -> dict[str, Any]:
    """The arguments to build a loader like `dataloader`, except those that decide the batching."""
    return {
        name: getattr(dataloader, name, default)
        for name, default in DATALOADER_DEFAULTS.items()
        if name not in _BATCHING_ARGUMENTS
    }


@rank_named_errors
def prepare_data_loader(
    dataloader: DataLoader,
    device: torch.device | None = None,
    num_processes: int | None = None,
    process_index: int | None = None,
    split_batches: bool = False,
    put_on_device: bool = False,
    rng_types: list[str | RNGType] | None = None,
    dispatch_batches: bool | None = None,
    even_batches: bool = True,
    slice_fn_for_dispatch: Callable[..., Any] | None = None,
    use_seedable_sampler: bool = False,
    data_seed: int | None = None,
    non_blocking: bool = False,
    use_stateful_dataloader: bool = False,
    torch_device_mesh: Any = None,
) -> DataLoader:
    """A new DataLoader that yields only this process's share of every batch; what `Accelerator.prepare` does to a DataLoader.

    Use it directly only without an Accelerator; the arguments are the Accelerator's dataloader
    settings, given explicitly.

    Args:
        dataloader (torch.utils.data.DataLoader): The dataloader, as written for one process.
        device (torch.device | None): Where batches go when `put_on_device` is True.
        num_processes (int | None): How many processes share the data; None means the process state's.
        process_index (int | None): This process's rank among them; None means the process state's.
        split_batches (bool): Cut each batch among the processes, instead of giving each process whole
            batches (default False: the global batch is `num_processes` times the batch size).
        put_on_device (bool): Move batches to `device` (default False).
        rng_types (list[str | RNGType] | None): The generators synchronised at each epoch's start.
        dispatch_batches (bool | None): The main process reads every batch and sends each process its
            slice; None means True for an iterable dataset whose batches go on the device. True needs
            `put_on_device=True` (ValueError otherwise).
        even_batches (bool): Complete the last round with samples from the start, so every process gets
            as many batches (default True).
        slice_fn_for_dispatch (Callable | None): How to cut a dispatched batch: `fn(batch, slice)`.
        use_seedable_sampler (bool): Shuffle with a sampler seeded by `set_seed` / `data_seed` (default
            False).
        data_seed (int | None): The seed of that sampler.
        non_blocking (bool): Copy to the device with `non_blocking=True` (default False).
        use_stateful_dataloader (bool): Build a torchdata `StatefulDataLoader` (default False).
        torch_device_mesh (DeviceMesh | None): With tensor or context parallelism, processes of one
            group get the same batches; the data-parallel ranks come from the mesh.

    Returns:
        torch.utils.data.DataLoader: A `DataLoaderShard` or `DataLoaderDispatcher`.

    Raises:
        TypeError: `dataloader` is not a DataLoader.
        ValueError: `dispatch_batches=True` without `put_on_device=True`, or batches that cannot be split.

    Example:
        >>> import torch
        >>> from cadence.data_loader import prepare_data_loader
        >>> loader = torch.utils.data.DataLoader(torch.arange(8), batch_size=2)
        >>> shard = prepare_data_loader(loader, num_processes=2, process_index=1)
        >>> [batch.tolist() for batch in shard]  # the second of two processes
        [[2, 3], [6, 7]]
    """
    if not isinstance(dataloader, DataLoader):
        raise TypeError(
            f"prepare_data_loader needs a torch.utils.data.DataLoader, got {type(dataloader).__name__}."
        )
    dataset = dataloader.dataset
    is_iterable = isinstance(dataset, IterableDataset)
    if dispatch_batches is None:
        dispatch_batches = bool(put_on_device) and is_iterable
    if dispatch_batches and not put_on_device:
        raise ValueError(
            "dispatch_batches=True needs put_on_device=True: the dispatched batches are broadcast from "
            "the device of the main process."
        )
    state = PartialState()
    num_processes = state.num_processes if num_processes is None else num_processes
    process_index = state.process_index if process_index is None else process_index
    if torch_device_mesh is not None:
        process_index, num_processes = mesh_data_parallel_coordinates(
            torch_device_mesh,
            process_index,
            num_processes,
            deepspeed=state.distributed_type == DistributedType.DEEPSPEED,
        )
    _check_coordinates(num_processes, process_index)
    if split_batches:
        _check_split_batch_size(dataloader, num_processes)
    _check_rng_types(rng_types)
    if data_seed is not None and (isinstance(data_seed, bool) or not isinstance(data_seed, int)):
        raise TypeError(f"data_seed must be an integer or None, got {data_seed!r}.")

    new_dataset = dataset
    new_batch_sampler = None if is_iterable else dataloader.batch_sampler
    sampler_is_batch_sampler = isinstance(dataloader.sampler, BatchSampler)
    synchronized_generator = None

    sampler = get_sampler(dataloader)
    if use_seedable_sampler and isinstance(sampler, RandomSampler):
        sampler = SeedableRandomSampler(
            data_source=sampler.data_source,
            replacement=sampler.replacement,
            num_samples=sampler._num_samples,
            generator=sampler.generator,
            data_seed=data_seed,
        )
        if data_seed is None and state.use_distributed and num_processes > 1:
            _agree_on_seed(sampler)

    if (
        num_processes != 1 or state.distributed_type == DistributedType.MEGATRON_LM
    ) and not dispatch_batches:
        if _is_shardable_hf_iterable(new_dataset, split_batches, num_processes):
            new_dataset = new_dataset.shard(num_shards=num_processes, index=process_index)
        elif is_iterable:
            if getattr(dataset, "generator", None) is not None:
                synchronized_generator = dataset.generator
            new_dataset = IterableDatasetShard(
                new_dataset,
                batch_size=dataloader.batch_size,
                drop_last=dataloader.drop_last,
                num_processes=num_processes,
                process_index=process_index,
                split_batches=split_batches,
            )
        else:
            if not use_seedable_sampler and hasattr(sampler, "generator"):
                if sampler.generator is None:
                    # Every process shuffles with this generator, overwritten by the main process's
                    # state at each iteration; the seed draw follows the reference's RNG consumption.
                    sampler.generator = torch.Generator(device=default_generator_device())
                    sampler.generator.manual_seed(
                        int(torch.empty((), dtype=torch.int64).random_().item())
                    )
                synchronized_generator = sampler.generator
            new_batch_sampler = BatchSamplerShard(
                dataloader.sampler if sampler_is_batch_sampler else dataloader.batch_sampler,
                num_processes=num_processes,
                process_index=process_index,
                split_batches=split_batches,
                even_batches=even_batches,
            )

    if rng_types is not None:
        rng_types = list(rng_types)
        if synchronized_generator is None and "generator" in rng_types:
            rng_types.remove("generator")

    kwargs = loader_arguments(dataloader)
    if new_batch_sampler is None and not sampler_is_batch_sampler:
        kwargs["drop_last"] = dataloader.drop_last
        kwargs["batch_size"] = (
            dataloader.batch_size // num_processes
            if split_batches and not dispatch_batches
            else dataloader.batch_size
        )
    # On XLA too: the loader moves its batches itself (data/xla_transfer), one batch ahead, in order.
    device = device if put_on_device else None
    if dispatch_batches:
        kwargs.pop("generator")
        if sampler_is_batch_sampler:
            kwargs.update(sampler=dataloader.sampler, batch_size=dataloader.batch_size)
        prepared = DataLoaderDispatcher(
            new_dataset,
            split_batches=split_batches,
            batch_sampler=new_batch_sampler,
            _drop_last=dataloader.drop_last,
            _non_blocking=non_blocking,
            slice_fn=slice_fn_for_dispatch,
            use_stateful_dataloader=use_stateful_dataloader,
            torch_device_mesh=torch_device_mesh,
            **kwargs,
        )
    elif sampler_is_batch_sampler:
        prepared = DataLoaderShard(
            new_dataset,
            device=device,
            sampler=new_batch_sampler if new_batch_sampler is not None else dataloader.sampler,
            batch_size=dataloader.batch_size,
            rng_types=rng_types,
            _drop_last=dataloader.drop_last,
            _non_blocking=non_blocking,
            synchronized_generator=synchronized_generator,
            use_stateful_dataloader=use_stateful_dataloader,
            torch_device_mesh=torch_device_mesh,
            **kwargs,
        )
    else:
        prepared = DataLoaderShard(
            new_dataset,
            device=device,
            batch_sampler=new_batch_sampler,
            rng_types=rng_types,
            synchronized_generator=synchronized_generator,
            _drop_last=dataloader.drop_last,
            _non_blocking=non_blocking,
            use_stateful_dataloader=use_stateful_dataloader,
            torch_device_mesh=torch_device_mesh,
            **kwargs,
        )
    if use_seedable_sampler and isinstance(sampler, SeedableRandomSampler):
        prepared.set_sampler(sampler)
    return prepared


def _check_coordinates(num_processes: Any, process_index: Any) -> None:
    for name, value in (("num_processes", num_processes), ("process_index", process_index)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"prepare_data_loader({name}=...) must be an integer, got {value!r}.")
    if num_processes < 1 or not 0 <= process_index < num_processes:
        raise ValueError(
            f"prepare_data_loader got process_index={process_index} for num_processes={num_processes}: "
            "num_processes must be at least 1 and process_index in [0, num_processes). Leave both unset "
            "to use this process's rank and the world size."
        )


def _check_rng_types(rng_types: Any) -> None:
    if rng_types is None:
        return
    known = RNGType.list()
    if isinstance(rng_types, (str, RNGType)) or not hasattr(rng_types, "__iter__"):
        raise TypeError(
            f"rng_types must be a list of names ({', '.join(known)}), got {rng_types!r}."
        )
    bad = [item for item in rng_types if str(getattr(item, "value", item)) not in known]
    if bad:
        raise ValueError(f"Unknown rng_types {bad!r}: use names among {', '.join(known)}.")


def _check_split_batch_size(dataloader: DataLoader, num_processes: int) -> None:
    batch_size = dataloader.batch_size
    if batch_size is None:
        batch_size = getattr(dataloader.batch_sampler, "batch_size", None)
        if batch_size is None:
            raise ValueError(
                "split_batches=True needs to know the batch size to cut it between processes, but "
                f"this DataLoader has batch_size=None and its batch sampler "
                f"({type(dataloader.batch_sampler).__name__}) has no `batch_size` attribute. Give the "
                "batch sampler a `batch_size`, or use split_batches=False."
            )
    if batch_size > 1 and batch_size % num_processes != 0:
        raise ValueError(
            f"split_batches=True needs a batch size ({batch_size}) that is a round multiple of the number of "
            f"processes ({num_processes}): change the batch size or use split_batches=False."
        )


def _agree_on_seed(sampler: SeedableRandomSampler) -> None:
    """Without data_seed every process takes its torch seed, which may differ: use the main one's."""

    sampler.initial_seed = broadcast_object_list([sampler.initial_seed], from_process=0)[0]


def _is_shardable_hf_iterable(dataset: Any, split_batches: bool, num_processes: int) -> bool:
    datasets = sys.modules.get("datasets")  # only a dataset of an imported `datasets` can be one
    hf_iterable = getattr(datasets, "IterableDataset", None)
    return (
        hf_iterable is not None
        and isinstance(dataset, hf_iterable)
        and not split_batches
        and dataset.n_shards >= num_processes
    )
