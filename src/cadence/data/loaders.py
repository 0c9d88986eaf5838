"""The prepared dataloaders: DataLoader subclasses that track where they stand and shard batches.

Each loader fetches one batch ahead so that it knows, while handing out the last batch, that it is the
last (`end_of_dataloader`), registers itself with GradientState while it iterates, and keeps a
LoaderPosition so that `state_dict()` / `load_state_dict()` resume exactly where it stopped.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

import torch
from torch.utils.data import BatchSampler, DataLoader

from ..diagnostics.stop_notice import notice as stop_notice
from ..runtime.random import synchronize_rng_states
from ..runtime.state import GradientState
from .device_prefetch import batch_transfer, pin_memory_kwargs
from .elastic import SourceResumeSkip, draw_from_global_rng, order_from_global_rng
from .position import (
    LoaderPosition,
    load_position,
    position_state_dict,
    restore_generators,
    take_snapshot,
)
from .samplers import ResumeSkip, SkipBatchSampler, get_sampler
from .sharding import IterableDatasetShard
from .stateful_layout import (
    TORCHDATA_SKIPS,
    forget_torchdata_state,
    from_torchdata_layout,
    hand_to_torchdata,
    is_torchdata_layout,
    live_state,
    split_cadence_position,
    with_cadence_position,
)

_EXHAUSTED = object()


class DataLoaderStateMixin:
    """`end_of_dataloader` and `remainder` of a dataloader, and its registration with GradientState.

    `remainder` is the number of real samples in the last global batch (the rest of it repeats samples
    from the start of the epoch), 0 when the dataset fills its last batch, -1 when unknown.
    """

    end_of_dataloader = False
    remainder = -1

    def reset(self) -> None:
        """Clear the end-of-dataloader flag and the remainder before a new pass."""
        self.end_of_dataloader = False
        self.remainder = -1

    def begin(self) -> None:
        """Mark the start of an iteration and make this the active dataloader of GradientState."""
        self.reset()
        self.remainder = self._initial_remainder()
        self.gradient_state._add_dataloader(self)

    def end(self) -> None:
        """Hand GradientState back to the dataloader that was active before this one."""
        self.gradient_state._remove_dataloader(self)

    def _initial_remainder(self) -> int:
        return -1


def stateful_variant(cls: type) -> type:
    """`cls` rebuilt on torchdata's StatefulDataLoader instead of the plain DataLoader."""
    try:
        from torchdata.stateful_dataloader import StatefulDataLoader
    except ImportError as error:
        raise ImportError(
            "use_stateful_dataloader=True needs torchdata's StatefulDataLoader (torchdata >= 0.8), "
            "which is not installed: `pip install torchdata`, or leave use_stateful_dataloader=False "
            "(Cadence's prepared dataloaders resume exactly on their own)."
        ) from error
    variant = _STATEFUL_VARIANTS.get(cls)
    if variant is None:

        def __reduce_ex__(self, protocol):  # the variant is rebuilt by name in the loading process
            return _stateful_instance, (cls,), self.__getstate__()

        attributes = {"__module__": cls.__module__, "__reduce_ex__": __reduce_ex__}
        variant = type(cls.__name__, (cls, StatefulDataLoader), attributes)
        _STATEFUL_VARIANTS[cls] = variant
    return variant


_STATEFUL_VARIANTS: dict[type, type] = {}


def _stateful_instance(cls: type) -> Any:
    return object.__new__(stateful_variant(cls))


def _torchdata_refuses_in_order() -> bool:
    from importlib.metadata import version

    from packaging.version import Version

    return Version(version("torchdata")) < Version("0.11")


def plain_loader_like(loader: DataLoader) -> DataLoader:
    """A DataLoader (a StatefulDataLoader for a stateful `loader`) reading what `loader` reads."""
    cls: type = DataLoader
    if getattr(loader, "use_stateful_dataloader", False):
        from torchdata.stateful_dataloader import StatefulDataLoader  # optional dependency

        cls = StatefulDataLoader
    kwargs: dict[str, Any] = {
        name: getattr(loader, name)
        for name in (
            "num_workers", "collate_fn", "pin_memory", "timeout", "worker_init_fn",
            "multiprocessing_context", "generator", "prefetch_factor", "persistent_workers",
            "pin_memory_device",
        )
    }  # fmt: skip
    if isinstance(loader.dataset, torch.utils.data.IterableDataset):
        kwargs.update(batch_size=loader.batch_size, drop_last=loader.drop_last)
    elif loader.batch_sampler is not None:
        kwargs["batch_sampler"] = loader.batch_sampler
    else:
        kwargs.update(batch_size=None, sampler=loader.sampler)
    return cls(loader.dataset, **kwargs)


class _instance_property(property):  # noqa: N801 (used as a decorator, like `property`)
    """A property that exists on instances only: read on the class it raises AttributeError, as an
    attribute set in `__init__` would (Accelerate's `base_dataloader` is one)."""

    def __get__(self, obj: Any, objtype: type | None = None) -> Any:
        if obj is None:
            name = self.fget.__name__ if self.fget else "attribute"
            raise AttributeError(
                f"type object {getattr(objtype, '__name__', '?')!r} has no attribute {name!r}: "
                "it belongs to each loader"
            )
        return super().__get__(obj, objtype)


class DataLoaderAdapter(DataLoader):
    """Base of the prepared dataloaders: position tracking, exact resume, epoch propagation.

    With `use_stateful_dataloader=True` the instance is built on torchdata's StatefulDataLoader.

    Args:
        dataset (Any): The dataset to read.
        use_stateful_dataloader (bool): Build the loader on torchdata's `StatefulDataLoader` (which
            must be installed), so that its `state_dict()` is torchdata's; default False.
        batch_sampler (Any): The batch sampler, as for `torch.utils.data.DataLoader`.
        **kwargs: Any other argument of `torch.utils.data.DataLoader` (collate_fn, num_workers ...).
    """

    # False resumes a loaded mid-epoch position as the reference does (the Accelerator sets it from
    # DataLoaderConfiguration.resume_exact_order; see docs/differences.md).
    resume_exact_order: bool = True

    def __new__(cls, *args: Any, use_stateful_dataloader: bool = False, **kwargs: Any):
        if use_stateful_dataloader:
            cls = stateful_variant(cls)
        return super().__new__(cls)

    def __init__(
        self,
        dataset: Any,
        use_stateful_dataloader: bool = False,
        batch_sampler: Any = None,
        **kwargs: Any,
    ) -> None:
        if use_stateful_dataloader and "in_order" in kwargs and _torchdata_refuses_in_order():
            kwargs.pop("in_order")
        super().__init__(dataset, batch_sampler=batch_sampler, **kwargs)
        self.use_stateful_dataloader = use_stateful_dataloader
        self.gradient_state = GradientState()
        self._position = LoaderPosition()
        self._resuming_index_sampler = None

    def __getstate__(self) -> dict[str, Any]:
        # An iterator in flight (worker processes, torchdata's kept iterator) does not travel: the
        # copy starts its next iteration afresh, from the position it carries.
        state = self.__dict__.copy()
        if state.get("_iterator") is not None:
            state["_iterator"] = None
        return state

    @_instance_property
    def base_dataloader(self) -> DataLoader:
        """The plain DataLoader this one reads through: same dataset, batch sampler and collation,
        without device placement or position tracking (built on first use, then kept).

        Example: `prepared.base_dataloader.batch_sampler` is the batch sampler of this process's shard.
        """
        base = self.__dict__.get("_base_dataloader")
        if base is None:
            base = self.__dict__["_base_dataloader"] = plain_loader_like(self)
        return base

    # -- position and exact resume --------------------------------------------------------------
    @property
    def iteration(self) -> int:
        """The current epoch: set by set_epoch, incremented after each complete pass."""
        return self._position.epoch

    @iteration.setter
    def iteration(self, value: int) -> None:
        """Set the epoch counter of the loader's position."""
        self._position.epoch = value

    def state_dict(self) -> dict[str, Any]:
        """Where this loader stands, as plain values and tensors (torch.load(weights_only=True)).

        Cadence's own position (epoch, batches handed out, generator states) that resumes exactly; with
        `use_stateful_dataloader=True`, torchdata's StatefulDataLoader state after the batches handed
        out so far, as Accelerate returns it (see data/stateful_layout.py).
        """
        if not self.use_stateful_dataloader:
            return position_state_dict(self, self._position)
        return self._torchdata_state()

    def checkpoint_state_dict(self) -> dict[str, Any]:
        """What save_state writes for this loader: `state_dict()`, with Cadence's exact position
        beside torchdata's state for a stateful loader, so that load_state resumes the same order."""
        exact = position_state_dict(self, self._position)
        if not self.use_stateful_dataloader:
            return exact
        return with_cadence_position(self._torchdata_state(), exact)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Continue, at the next iteration, from the batch after the last one handed out before the
        state was taken: with the same samples in the same order from Cadence's position, or as
        torchdata resumes its own state (a stateful loader's `state_dict()`, or one torchdata wrote).

        Args:
            state_dict (dict[str, Any]): What `state_dict()` of a loader over the same data returned.
        """
        if not (self.use_stateful_dataloader and is_torchdata_layout(state_dict)):
            load_position(self, self._position, state_dict)
            return
        torchdata_state, exact = split_cadence_position(state_dict)
        self.__dict__.pop("_handed_out_state", None)
        if exact is not None and exact.get("exact", True) and self.resume_exact_order:
            load_position(self, self._position, exact)  # validates before anything changes
            forget_torchdata_state(self)  # Cadence replays the saved epoch itself
            self._loaded_torchdata_state = torchdata_state
            return
        counted = from_torchdata_layout(
            torchdata_state,
            self._position.epoch,
            self._base_batches_per_batch(),
            skipped_by_torchdata=True,
        )
        load_position(self, self._position, counted)
        hand_to_torchdata(self, torchdata_state)
        self._loaded_torchdata_state = torchdata_state

    def _torchdata_state(self) -> dict[str, Any]:
        handed_out = self.__dict__.get("_handed_out_state")
        if handed_out is not None:  # an epoch under way: the state as of the last batch handed out
            return handed_out
        loaded = self.__dict__.get("_loaded_torchdata_state")
        if loaded is not None and self._position.pending is not None:
            return loaded  # loaded, not yet resumed
        if self._iterator is None:
            # torchdata creates the epoch's iterator now and reuses it at the next iteration: the
            # random states the epoch starts from are the ones of this moment.
            self._early_snapshot = take_snapshot(self, with_global=True)
        return live_state(self)

    def _base_batches_per_batch(self) -> int:
        """How many batches of torchdata's iterator make one batch handed out."""
        return 1

    @property
    def _index_sampler(self) -> Any:
        resuming = self.__dict__.get("_resuming_index_sampler")
        if resuming is not None:
            return resuming
        return self.batch_sampler if self._auto_collation else self.sampler

    def _open_base_iterator(
        self, resume: dict[str, Any] | None, index_skip: int, fetch_first: bool
    ) -> tuple[Iterator[Any], Any, dict[str, Any]]:
        """The base loader's iterator (and its first batch), created under the epoch's RNG states.

        When resuming, the generators and torch's global generator are set back to their states at
        the start of the saved epoch while the epoch's order is drawn, then the global generator
        returns to its loaded state, so the rest of training sees the RNG it had when it was saved.
        """
        loaded_global = None
        early = self.__dict__.pop("_early_snapshot", None)
        self.__dict__.pop("_loaded_torchdata_state", None)
        if resume is not None and not resume.get(TORCHDATA_SKIPS):
            restore_generators(self, resume)
            if "torch_rng_state" in resume:
                loaded_global = torch.get_rng_state()
                torch.set_rng_state(resume["torch_rng_state"])
            if self.use_stateful_dataloader:
                # An iterator torchdata made earlier (state_dict() before iterating) drew its order
                # from other random states.
                forget_torchdata_state(self)
                early = None
            elif (
                (index_skip or resume.get("source_skip"))
                and self.persistent_workers
                and self.num_workers > 0
            ):
                self._iterator = None  # a kept iterator would not see the skipping index sampler
        if early is None or not getattr(self, "_initial_iter_for_state_dict", False):
            early = None  # the iterator state_dict() made is not the one this epoch reads
        put_back = None
        if resume is not None and order_from_global_rng(resume):
            # Saved where the sampler shuffled with the global generator (one process): this
            # epoch's order is drawn from it again, whatever generator this loader shuffles with.
            put_back = draw_from_global_rng(self)
        snapshot = early if early is not None else take_snapshot(self, with_global=True)
        resuming = None
        if index_skip:
            resuming = ResumeSkip(self._index_sampler, index_skip)
            self._resuming_index_sampler = resuming
        elif resume is not None and resume.get("source_skip"):  # another number of processes
            resuming = SourceResumeSkip(self._index_sampler, int(resume["source_skip"]))
            self._resuming_index_sampler = resuming
        try:
            iterator = super().__iter__()
            if resuming is not None:
                # The iterator holds the wrapper (persistent workers re-iterate it each epoch): from
                # now on it must not skip anything.
                self._resuming_index_sampler = None
                resuming.skip = 0
            first = next(iterator, _EXHAUSTED) if fetch_first else _EXHAUSTED
        finally:
            self._resuming_index_sampler = None
            if put_back is not None:
                put_back()
            if loaded_global is not None:
                torch.set_rng_state(loaded_global)
        return iterator, first, snapshot

    def _sampler_skip(self) -> int:
        sampler = self.sampler if isinstance(self.sampler, BatchSampler) else self.batch_sampler
        return sampler.skip_batches if isinstance(sampler, SkipBatchSampler) else 0

    # -- epochs and samplers --------------------------------------------------------------------
    def set_epoch(self, epoch: int) -> None:
        """Set the epoch here, on the batch sampler, the sampler or else the dataset.

        Args:
            epoch (int): The epoch number; a seeded shuffle draws a different order for each.
        """
        if self.iteration != epoch:
            self.iteration = epoch
        batch_sampler = (
            self.sampler if isinstance(self.sampler, BatchSampler) else self.batch_sampler
        )
        if hasattr(batch_sampler, "set_epoch"):
            batch_sampler.set_epoch(epoch)
        sampler = get_sampler(self)
        if hasattr(sampler, "set_epoch"):
            sampler.set_epoch(epoch)
        elif hasattr(self.dataset, "set_epoch"):
            self.dataset.set_epoch(epoch)

    def get_sampler(self) -> Any:
        """The sampler that decides the order of the samples of this loader."""
        return get_sampler(self)

    def set_sampler(self, sampler: Any) -> None:
        """Replace the sampler of indices at every level of the batch-sampler wrappers.

        Args:
            sampler (Any): The new sampler of dataset indices (a `torch.utils.data.Sampler`).
        """
        holder = self.sampler if isinstance(self.sampler, BatchSampler) else self.batch_sampler
        while holder is not None:
            holder.sampler = sampler
            holder = holder.__dict__.get("batch_sampler")

    @property
    def total_dataset_length(self) -> int:
        """Length of the whole dataset, before it is split across the processes."""
        if hasattr(self.dataset, "total_length"):
            return self.dataset.total_length
        return len(self.dataset)


class DataLoaderShard(DataLoaderAdapter, DataLoaderStateMixin):
    """A DataLoader that yields this process's batches, on `device`, with synchronised shuffling.

    At each iteration the random generators named in `rng_types` are copied from the main process, so
    every process draws the same order of the whole dataset before taking its shard of it.
    `prepare()` / `prepare_data_loader()` build it for you.

    Args:
        dataset (Any): The dataset to read.
        device (Any): Where each batch is moved before it is handed out; None leaves it where the
            collate function put it.
        rng_types (list[Any] | None): The random generators ("torch", "cuda", "generator", ...)
            copied from the main process at the start of each iteration; None copies none.
        synchronized_generator (torch.Generator | None): The sampler's generator, synchronised when
            "generator" is among `rng_types`.
        skip_batches (int): How many batches to skip at the start of the first iteration (default 0).
        use_stateful_dataloader (bool): Build it on torchdata's `StatefulDataLoader` (default False).
        torch_device_mesh (Any): The device mesh of tensor or context parallelism, if any; kept as an
            attribute, which `skip_first_batches` carries over to the loader it builds.
        iteration (int): The epoch to start from (default 0).
        **kwargs: Any other argument of `torch.utils.data.DataLoader` (batch_sampler, collate_fn,
            num_workers ...).
    """

    def __init__(
        self,
        dataset: Any,
        device: Any = None,
        rng_types: list[Any] | None = None,
        synchronized_generator: torch.Generator | None = None,
        skip_batches: int = 0,
        use_stateful_dataloader: bool = False,
        _drop_last: bool = False,
        _non_blocking: bool = False,
        torch_device_mesh: Any = None,
        iteration: int = 0,
        **kwargs: Any,
    ) -> None:
        # hook (issue 15, data/device_prefetch): batches bound for CUDA come from pinned host memory.
        kwargs = pin_memory_kwargs(kwargs, device)
        super().__init__(dataset, use_stateful_dataloader=use_stateful_dataloader, **kwargs)
        self.device = device
        self.rng_types = rng_types
        self.synchronized_generator = synchronized_generator
        self.skip_batches = skip_batches
        self._drop_last = _drop_last
        self._non_blocking = _non_blocking
        self.torch_device_mesh = torch_device_mesh
        self.iteration = iteration

    def __iter__(self) -> Iterator[Any]:
        passes = self._pass()
        batches = self._batches_per_epoch()
        if batches is not None:  # a pass left unfinished, or resumed at its epoch's end
            position = self._position
            position.restart_if_left()
            drop_last = self.drop_last or self._drop_last
            if position.resumes_after_the_end(batches, len(self.dataset), drop_last):
                leftover = next(passes, _EXHAUSTED)  # a wrong yes only starts the pass early
                return iter(()) if leftover is _EXHAUSTED else itertools.chain([leftover], passes)
        return passes

    def _batches_per_epoch(self) -> int | None:
        """This process's batches in an epoch; None when not known here (an iterable dataset, a
        skip of its own, torchdata's state)."""
        if self.use_stateful_dataloader or self.skip_batches or self._sampler_skip():
            return None
        if isinstance(self.dataset, torch.utils.data.IterableDataset):
            return None
        return DataLoaderAdapter.__len__(self)

    def _pass(self) -> Iterator[Any]:
        # Everything happens at the first next(), as for any generator (iter() alone does nothing),
        # except the end of a pass left unfinished or resumed at its epoch's end (see __iter__).
        stop_notice.at_step_boundary()  # the graceful stop happens before a batch is handed out
        resume = self._position.take_pending()
        exact = resume is not None and resume.get("exact", True)
        if not exact and self.rng_types is not None:  # an exact resume replays the saved states
            synchronize_rng_states(self.rng_types, self.synchronized_generator)
        self.begin()
        self.set_epoch(self.iteration)
        position = self._position
        self._handed_out_state = None
        own_skip = self._sampler_skip() + self.skip_batches
        resume_skip = resume["batches_yielded"] if resume is not None and not own_skip else 0
        # torchdata skips the batches of a state it resumes; Cadence skips those of its own position
        skip_here = 0 if resume is not None and resume.get(TORCHDATA_SKIPS) else resume_skip
        iterable = isinstance(self.dataset, torch.utils.data.IterableDataset)
        discard = self.skip_batches + (skip_here if iterable else 0)
        iterator, current, snapshot = self._open_base_iterator(
            resume, 0 if iterable else skip_here, fetch_first=True
        )
        source_skip = int(resume.get("source_skip", 0)) if resume is not None else 0
        position.start_epoch(snapshot, own_skip + resume_skip, source_skip)
        if source_skip and self.remainder >= 0:
            # Resumed on another number of processes: the last global batch holds what is left
            # after the samples trained before the save (the rest of it is padding).
            self.remainder = self._samples_left_after(source_skip) % self.total_batch_size
        # An epoch resumed after its last batch has nothing left but still ends.
        had_batches = current is not _EXHAUSTED or resume_skip > 0 or source_skip > 0
        while discard and current is not _EXHAUSTED:
            current = next(iterator, _EXHAUSTED)
            discard -= 1
        if current is _EXHAUSTED:
            if had_batches:
                self.end_of_dataloader = True
                position.finish_epoch()
            else:
                position.in_epoch = False
            self.end()
            return
        # -- hook (issue 15, data/device_prefetch): to CUDA the next batch is copied on a side stream
        # while this one trains; elsewhere batches move as before.
        transfer = batch_transfer(current, self.device, self._non_blocking)
        pending = transfer.start(current)
        yielded = position.yielded
        # A stateful loader notes torchdata's state after fetching each batch, before the look-ahead.
        stateful = self.use_stateful_dataloader
        state_of_current = live_state(self) if stateful else None
        while True:
            current = transfer.finish(pending)
            upcoming = next(iterator, _EXHAUSTED)
            if upcoming is _EXHAUSTED:
                break
            state_of_upcoming = live_state(self) if stateful else None
            pending = transfer.start(upcoming)
            # -- end of hook
            yielded += 1
            position.yielded = yielded
            self._handed_out_state = state_of_current
            yield current
            stop_notice.at_step_boundary()
            state_of_current = state_of_upcoming
        self.end_of_dataloader = True
        self._settle_remainder()
        position.yielded = yielded + 1
        if stateful:  # as the reference does, the last batch's state says the epoch is over
            state_of_current["_iterator_finished"] = True
        self._handed_out_state = state_of_current
        yield current
        self._handed_out_state = None
        position.finish_epoch()
        self.end()

    def __len__(self) -> int:
        length = super().__len__()
        if self.skip_batches and isinstance(self.dataset, torch.utils.data.IterableDataset):
            return max(length - self.skip_batches, 0)
        return length

    # -- sizes and padding ----------------------------------------------------------------------
    @property
    def total_batch_size(self) -> int:
        """Number of samples in one step summed over all the processes."""
        if isinstance(self.dataset, IterableDatasetShard):
            return self.dataset.global_batch_size
        batch_sampler = (
            self.sampler if isinstance(self.sampler, BatchSampler) else self.batch_sampler
        )
        if getattr(batch_sampler, "split_batches", False):
            return batch_sampler.batch_size
        return batch_sampler.batch_size * getattr(batch_sampler, "num_processes", 1)

    @property
    def _pads_last_batch(self) -> bool:
        if isinstance(self.dataset, IterableDatasetShard):
            return not self.dataset.drop_last and self.dataset.num_processes > 1
        batch_sampler = (
            self.sampler if isinstance(self.sampler, BatchSampler) else self.batch_sampler
        )
        return bool(getattr(batch_sampler, "pads_last_batch", False))

    def _initial_remainder(self) -> int:
        batch_sampler = (
            self.sampler if isinstance(self.sampler, BatchSampler) else self.batch_sampler
        )
        if self._drop_last or getattr(batch_sampler, "drop_last", False):
            return -1  # nothing is repeated: the last batch needs no trimming
        try:
            if isinstance(self.dataset, IterableDatasetShard):
                return len(self.dataset.dataset) % self.dataset.global_batch_size
            return self._samples_per_epoch() % self.total_batch_size
        except Exception:  # noqa: BLE001 - no length or no batch size: unknown
            return -1

    def _samples_left_after(self, source_batches: int) -> int:
        batch_sampler = (
            self.sampler if isinstance(self.sampler, BatchSampler) else self.batch_sampler
        )
        return max(self._samples_per_epoch() - source_batches * batch_sampler.batch_size, 0)

    def _samples_per_epoch(self) -> int:
        sampler = get_sampler(self)
        if sampler is not None and not hasattr(self.dataset, "total_length"):
            try:
                return len(sampler)
            except TypeError:
                pass
        return self.total_dataset_length

    def _settle_remainder(self) -> None:
        """Once the stream of an iterable dataset ended, its length is known exactly."""
        dataset = self.dataset
        if isinstance(dataset, IterableDatasetShard) and not self._drop_last:
            seen = dataset.samples_seen  # set in this process only when there are no workers
            if seen is not None:
                self.remainder = seen % dataset.global_batch_size


class SkipDataLoader(DataLoaderAdapter, DataLoaderStateMixin):
    """A plain DataLoader that skips its first `skip_batches` batches (for iterable datasets).

    Args:
        dataset (Any): The dataset to read.
        skip_batches (int): How many batches to skip at the start of each iteration (default 0).
        use_stateful_dataloader (bool): Build it on torchdata's `StatefulDataLoader` (default False).
        **kwargs: Any other argument of `torch.utils.data.DataLoader`.
    """

    def __init__(
        self,
        dataset: Any,
        skip_batches: int = 0,
        use_stateful_dataloader: bool = False,
        **kwargs: Any,
    ) -> None:
        super().__init__(dataset, use_stateful_dataloader=use_stateful_dataloader, **kwargs)
        self.skip_batches = skip_batches
        self.device = None
        self.rng_types = None
        self.synchronized_generator = None
        self._drop_last = self.drop_last
        self._non_blocking = False

    __iter__ = DataLoaderShard.__iter__
    _pass = DataLoaderShard._pass
    _batches_per_epoch = DataLoaderShard._batches_per_epoch
    _settle_remainder = DataLoaderShard._settle_remainder

    def __len__(self) -> int:
        return max(super().__len__() - self.skip_batches, 0)

    @property
    def _pads_last_batch(self) -> bool:
        return False
