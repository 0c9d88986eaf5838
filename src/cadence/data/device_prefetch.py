"""Keeping the GPU fed: pinned host batches, asynchronous copies, and the next batch copied on a side
stream while the current step runs.

`DataLoaderShard` asks `batch_transfer` once per epoch how to move its batches, then calls
`start(batch)` as soon as a batch comes out of the DataLoader and `finish(pending)` just before handing
it to the training loop:

- to CUDA, `start` issues the host-to-device copy (`non_blocking=True`) on a side stream and returns at
  once, so the copy of batch i+1 overlaps the forward and backward of batch i; `finish` makes the
  training stream wait for that copy (an event, not a host synchronisation) and tells the caching
  allocator that the training stream now uses those tensors (`record_stream`), so their memory is not
  reused under it. The copy is only truly asynchronous from pinned host memory: `pin_memory_kwargs`
  turns the DataLoader's `pin_memory` on when the batches go to a CUDA device.
- anywhere else (CPU, MPS, no device), `start` moves the batch as before and `finish` returns it.
"""

from __future__ import annotations

from typing import Any

import torch

from ..runtime.collectives import recursively_apply, send_to_device
from .batches import device_mover


def pin_memory_kwargs(kwargs: dict[str, Any], device: Any) -> dict[str, Any]:
    """The DataLoader arguments with `pin_memory=True` when batches go to a CUDA device.

    Pinned (page-locked) host memory is what lets a host-to-device copy run asynchronously; a DataLoader
    that already pins, or one whose batches stay on the host, is left as it is. (A DataLoader does not
    record whether `pin_memory=False` was written or defaulted, so both are pinned for CUDA.)
    """
    if device is None or torch.device(device).type != "cuda" or kwargs.get("pin_memory"):
        return kwargs
    return {**kwargs, "pin_memory": True}


class _Transfer:
    """Moves batches synchronously (or not at all): what every device but CUDA gets."""

    def __init__(self, move: Any) -> None:
        self.move = move

    def start(self, batch: Any) -> Any:
        """Begin moving `batch`; returns what `finish` takes."""
        return batch if self.move is None else self.move(batch)

    def finish(self, pending: Any) -> Any:
        """The batch on its device, ready for the training step."""
        return pending


class _CudaPrefetch(_Transfer):
    """Copies on a side stream; the training stream waits on an event only when it needs the batch."""

    def __init__(self, device: torch.device) -> None:
        super().__init__(None)
        self.device = device
        self.stream = torch.cuda.Stream(device=device)

    def start(self, batch: Any) -> Any:
        """Issue the copy of `batch` on the side stream and return at once."""
        # No wait on the training stream: the destination is fresh memory of the side stream's pool, and
        # `finish` records its use by the training stream, so the allocator never hands it out early.
        with torch.cuda.stream(self.stream):
            moved = send_to_device(batch, self.device, non_blocking=True)
            done = torch.cuda.Event()
            done.record(self.stream)
        return moved, done

    def finish(self, pending: Any) -> Any:
        """Make the training stream wait for the copy, and mark the tensors as used by it."""
        moved, done = pending
        current = torch.cuda.current_stream(self.device)
        current.wait_event(done)

        def used_by_current(tensor: torch.Tensor) -> torch.Tensor:
            if tensor.is_cuda:
                tensor.record_stream(current)
            return tensor

        return recursively_apply(used_by_current, moved)


def batch_transfer(sample_batch: Any, device: Any, non_blocking: bool) -> _Transfer:
    """How to move batches like `sample_batch` to `device`: prefetched on a side stream to CUDA, as
    before elsewhere (decided once per epoch, from its first batch)."""
    move = device_mover(sample_batch, device, non_blocking)
    if move is not None and torch.device(device).type == "xla":
        from .xla_transfer import (
            XlaTransfer,  # deferred: torch_xla loads only when batches go to an XLA device
        )

        return XlaTransfer(torch.device(device))  # type: ignore[return-value]
    if move is not None and torch.device(device).type == "cuda":
        target = torch.device(device)
        if target.index is None:
            target = torch.device("cuda", torch.cuda.current_device())
        return _CudaPrefetch(target)
    return _Transfer(move)
