"""Dispatching: the main process reads every batch and sends each process its slice.

Per global batch the main process broadcasts a small header (the batch's structure, whether it is the
last, how many real samples it holds) and then the tensors; every process keeps its slice. Without
`split_batches` a global batch is `num_processes` batches of the base loader put end to end. The last
global batch, when its size is not a multiple of the number of processes, is completed on the main
process with samples from the first one, so all processes get slices of the same size.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from typing import Any

from ..diagnostics.stop_notice import notice as stop_notice
from ..runtime.collectives import broadcast, broadcast_object_list, send_to_device
from ..runtime.state import PartialState
from .batches import get_data_structure, initialize_tensors
from .loaders import _EXHAUSTED, DataLoaderAdapter, DataLoaderStateMixin
from .mixed_batches import (
    extend_batch,
    holds_objects,
    put_end_to_end,
    samples_in,
    slice_batch,
    tensors_of,
)
from .stateful_layout import TORCHDATA_SKIPS, live_state

_STOP, _BATCH, _ERROR = "stop", "batch", "error"


class DataLoaderDispatcher(DataLoaderAdapter, DataLoaderStateMixin):
    """A DataLoader iterated on the main process only, whose batches are split between processes.

    The main process reads each batch (of `num_processes` times the batch size unless
    `split_batches`), broadcasts it, and every process keeps its slice. `prepare()` builds it when
    `DataLoaderConfiguration(dispatch_batches=True)` (the default for an iterable dataset).

    Args:
        dataset (Any): The dataset to read (on the main process only).
        split_batches (bool): The loader's batch size is the global one: each batch is split into
            `num_processes` parts. False (default): the main process reads `num_processes` batches'
            worth at once.
        skip_batches (int): How many batches to skip at the start of the first iteration (default 0).
        use_stateful_dataloader (bool): Build it on torchdata's `StatefulDataLoader` (default False).
        slice_fn (Callable[..., Any] | None): Cuts a process's part out of a whole batch, called as
            `slice_fn(batch, slice, process_index=..., num_processes=...)`; None cuts every tensor and
            per-sample list along its first dimension.
        torch_device_mesh (Any): The device mesh of tensor or context parallelism, if any; kept as an
            attribute, which `skip_first_batches` carries over to the loader it builds.
        iteration (int): The epoch to start from (default 0).
        **kwargs: Any other argument of `torch.utils.data.DataLoader` (batch_size, collate_fn ...).
    """

    def __init__(
        self,
        dataset: Any,
        split_batches: bool = False,
        skip_batches: int = 0,
        use_stateful_dataloader: bool = False,
        _drop_last: bool = False,
        _non_blocking: bool = False,
        slice_fn: Callable[..., Any] | None = None,
        torch_device_mesh: Any = None,
        iteration: int = 0,
        **kwargs: Any,
    ) -> None:
        super().__init__(dataset, use_stateful_dataloader=use_stateful_dataloader, **kwargs)
        self.split_batches = split_batches
        self.state = PartialState()
        self.skip_batches = skip_batches
        self._drop_last = _drop_last
        self._non_blocking = _non_blocking
        # The default cuts tensors and per-sample lists (strings...) alike; see mixed_batches.
        self.slice_fn = slice_batch if slice_fn is None else slice_fn
        self._user_slice_fn = slice_fn is not None
        self.torch_device_mesh = torch_device_mesh
        self.iteration = iteration

    # -- iteration ------------------------------------------------------------------------------
    def __iter__(self) -> Iterator[Any]:
        stop_notice.at_step_boundary()  # the graceful stop happens before a batch is handed out
        resume = self._position.take_pending()
        self.begin()
        self.set_epoch(self.iteration)
        position = self._position
        resume_skip = (
            resume["batches_yielded"] if resume is not None and not self.skip_batches else 0
        )
        # torchdata skips the batches of a state it resumes; Cadence skips those of its own position
        by_torchdata = resume is not None and resume.get(TORCHDATA_SKIPS)
        skip = self.skip_batches + (0 if by_torchdata else resume_skip)
        is_main = self.state.process_index == 0
        self._handed_out_state = None
        # Every process creates the base iterator (as the reference does, for its RNG draws); only the
        # main process reads from it.
        iterator, first, snapshot = self._open_base_iterator(resume, 0, fetch_first=is_main)
        position.start_epoch(snapshot, self.skip_batches + resume_skip)
        producer = self._produce(iterator, first, skip, resume_skip > 0) if is_main else None
        yielded = position.yielded
        while True:
            header, batch = self._next_header(producer)
            kind = header[0]
            if kind == _STOP:
                self._handed_out_state = None
                if header[1]:
                    self.end_of_dataloader = True
                    position.finish_epoch()
                else:
                    position.in_epoch = False
                self.end()
                return
            _, structure, is_last, observed = header
            if not is_main:
                batch = initialize_tensors(structure, device=self.state.device)
            tensors = tensors_of(batch)
            if tensors:  # the objects came with the structure; the tensors are filled in place
                broadcast(tensors, from_process=0)
            per_process = samples_in(batch) // self.state.num_processes
            rank = self.state.process_index
            batch = self.slice_fn(
                batch,
                slice(rank * per_process, (rank + 1) * per_process),
                process_index=rank,
                num_processes=self.state.num_processes,
            )
            if self._user_slice_fn:  # objects kept per batch still name their batch: pick ours
                batch = slice_batch(batch, slice(None), process_index=rank)
            yielded += 1
            position.yielded = yielded
            if is_last:
                self.end_of_dataloader = True
                self.remainder = observed
                yield batch
                position.finish_epoch()
                self.end()
                return
            yield batch
            stop_notice.at_step_boundary()

    def _base_batches_per_batch(self) -> int:
        return 1 if self.split_batches else self.state.num_processes

    def _next_header(self, producer: Iterator[Any] | None) -> tuple[list[Any], Any]:
        """The next header on every process (the batch itself stays on the main process).

        A failure while the main process reads is sent to the others, so that all raise instead of
        the others waiting forever."""
        header, batch, failure = None, None, None
        if producer is not None:
            try:
                header, batch = next(producer)
            except Exception as error:  # noqa: BLE001 - re-raised below, on every process
                failure = error
                header = [_ERROR, f"{type(error).__name__}: {error}"]
        header = broadcast_object_list([header], from_process=0)[0]
        if failure is not None:
            raise failure
        if header[0] == _ERROR:
            raise RuntimeError(
                f"[rank {self.state.process_index}] The main process failed to read the next batch "
                f"to dispatch: {header[1]}"
            )
        return header, batch

    def _produce(
        self, iterator: Iterator[Any], first: Any, skip: int, resumed: bool
    ) -> Iterator[tuple[list[Any], Any]]:
        """Main process: the header (and padded batch) of each global batch to send, then a stop."""
        stream = self._global_batches(iterator, first)
        current = next(stream, _EXHAUSTED)
        head = None  # the first samples of the epoch, to complete the last global batch
        while skip and current is not _EXHAUSTED:
            head = self._head_of(current) if head is None else head
            current = next(stream, _EXHAUSTED)
            skip -= 1
        had_batches = current is not _EXHAUSTED or resumed or head is not None
        # A stateful loader notes torchdata's state after fetching each batch, before the look-ahead.
        stateful = self.use_stateful_dataloader
        state_of_current = live_state(self) if stateful and current is not _EXHAUSTED else None
        while current is not _EXHAUSTED:
            head = self._head_of(current) if head is None else head
            upcoming = next(stream, _EXHAUSTED)
            is_last = upcoming is _EXHAUSTED
            state_of_upcoming = live_state(self) if stateful and not is_last else None
            observed = samples_in(current)
            batch = current
            if is_last and not self._drop_last:
                batch = self._complete(batch, observed, head)
            batch = send_to_device(batch, self.state.device, non_blocking=self._non_blocking)
            structure = get_data_structure(batch)
            if holds_objects(batch):
                _check_picklable(structure)
            if stateful:
                if is_last:  # as the reference does, the last batch's state says the epoch is over
                    state_of_current["_iterator_finished"] = True
                self._handed_out_state = state_of_current
            yield [_BATCH, structure, is_last, observed], batch
            current, state_of_current = upcoming, state_of_upcoming
        yield [_STOP, had_batches], None

    def _global_batches(self, iterator: Iterator[Any], first: Any) -> Iterator[Any]:
        pending = first

        def next_base() -> Any:
            nonlocal pending
            if pending is not _EXHAUSTED:
                item, pending = pending, _EXHAUSTED
                return item
            return next(iterator, _EXHAUSTED)

        if self.split_batches:
            while (batch := next_base()) is not _EXHAUSTED:
                yield batch
            return
        n = self.state.num_processes
        while True:
            parts = []
            while len(parts) < n and (batch := next_base()) is not _EXHAUSTED:
                parts.append(batch)
            if not parts or (len(parts) < n and self._drop_last):
                return
            yield parts[0] if len(parts) == 1 else _concatenate(parts)
            if len(parts) < n:
                return

    def _head_of(self, batch: Any) -> Any:
        n = self.state.num_processes
        return self.slice_fn(batch, slice(0, n), process_index=0, num_processes=n)

    def _complete(self, batch: Any, observed: int, head: Any) -> Any:
        n = self.state.num_processes
        missing = math.ceil(observed / n) * n - observed
        if missing == 0:
            return batch
        repeats = math.ceil(missing / samples_in(head))
        filler = head if repeats == 1 else put_end_to_end([head] * repeats)
        return extend_batch(batch, filler, missing)

    def __len__(self) -> int:
        whole = super().__len__()
        if self.split_batches:
            batches = whole
        elif self._drop_last:
            batches = whole // self.state.num_processes
        else:
            batches = math.ceil(whole / self.state.num_processes)
        return max(batches - self.skip_batches, 0)

    # -- sizes and padding ----------------------------------------------------------------------
    @property
    def total_batch_size(self) -> int:
        """Number of samples in one step summed over all the processes."""
        batch_size = self.batch_size
        if batch_size is None:
            batch_size = getattr(self.batch_sampler, "batch_size", None)
        return batch_size if self.split_batches else batch_size * self.state.num_processes

    @property
    def total_dataset_length(self) -> int:
        """Length of the whole dataset."""
        return len(self.dataset)

    @property
    def _pads_last_batch(self) -> bool:
        return not self._drop_last and self.state.num_processes > 1


def _concatenate(parts: list[Any]) -> Any:
    try:
        return put_end_to_end(parts)
    except RuntimeError as error:
        raise RuntimeError(
            "With dispatch_batches=True (the default for an IterableDataset) the main process puts "
            "num_processes batches end to end, so they must have the same shape except the first "
            "dimension. Use dispatch_batches=False (each process reads its own batches) or "
            f"split_batches=True (one batch is cut between processes). ({error})"
        ) from error


def _check_picklable(structure: Any) -> None:
    """The objects of a batch travel pickled: fail here, where every process hears of it, rather than
    inside the broadcast, which would leave the other processes waiting."""
    import pickle

    try:
        pickle.dumps(structure)
    except Exception as error:  # noqa: BLE001 - any pickling failure means the same thing
        raise TypeError(
            "dispatch_batches=True sends the Python objects of a batch pickled, and this batch holds "
            f"one that cannot be pickled ({type(error).__name__}: {error}). Keep such objects out of "
            "the batch, or pass dispatch_batches=False so each process reads its own batches."
        ) from None
