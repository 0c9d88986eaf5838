"""Batches for an XLA device: moved with torch_xla's host-to-device transfer one batch ahead, split
over the SPMD mesh when there is one, and the lazy graph cut before each batch is handed out (what
torch_xla's `MpDeviceLoader` does, without its background thread; see docs/differences.md).

The transfer runs inside `DataLoaderShard` (through `device_prefetch.batch_transfer`), so the loader's
own bookkeeping (end_of_dataloader, the position saved by save_state) stays in step with training.
`CADENCE_XLA_MP_DEVICE_LOADER=1` wraps the prepared loader in `MpDeviceLoader` instead, as Accelerate
does (`wrap_in_mp_device_loader`).
"""

from __future__ import annotations

from typing import Any

import torch

from ..runtime.collectives import recursively_apply
from ..xla import runtime as xla_runtime


def _sharder() -> Any:
    mesh = xla_runtime.global_mesh()
    if mesh is None:
        return None
    xs = xla_runtime.spmd()
    axes = tuple(mesh.axis_names)
    batch_axis = axes[0] if len(axes) == 1 else axes

    def shard(tensor: torch.Tensor) -> torch.Tensor:
        if tensor.ndim > 0:
            xs.mark_sharding(tensor, mesh, (batch_axis,) + (None,) * (tensor.ndim - 1))
        return tensor

    return shard


class XlaTransfer:
    """`start` sends a host batch to the XLA device (split over the SPMD mesh, if any); `finish` cuts
    the graph of the step that just ended and returns the batch."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.xm = xla_runtime.xm()
        self.shard = _sharder()
        self._cuts_at_last_batch = -1

    def start(self, batch: Any) -> Any:
        """Begin the host-to-device transfer of `batch`."""
        moved = self.xm.send_cpu_data_to_device(batch, self.device)
        if self.shard is not None:
            moved = recursively_apply(self.shard, moved)
        return moved

    def finish(self, pending: Any) -> Any:
        """Run the graph of the previous step (a step boundary), then hand out the batch. When the
        optimizer step already cut the graph since the last batch, a second cut would be empty: skipped."""
        if xla_runtime.sync_count() == self._cuts_at_last_batch:
            xla_runtime.sync()
        self._cuts_at_last_batch = xla_runtime.sync_count()
        return pending


class MpDeviceLoaderWrapper:
    """Accelerate's behaviour: the prepared loader (its batches left on the host) read through
    torch_xla's `MpDeviceLoader`, whose thread runs ahead of training. Attributes are the loader's."""

    def __init__(self, loader: Any, device: torch.device) -> None:
        self._loader = loader
        self._device = device

    def __iter__(self) -> Any:
        from torch_xla.distributed.parallel_loader import MpDeviceLoader  # optional dependency

        mesh = xla_runtime.global_mesh()
        kwargs: dict[str, Any] = {}
        if mesh is not None:
            axes = tuple(mesh.axis_names)
            kwargs["input_sharding"] = xla_runtime.spmd().ShardingSpec(
                mesh, (axes[0] if len(axes) == 1 else axes, None)
            )
        return iter(MpDeviceLoader(self._loader, self._device, **kwargs))

    def __len__(self) -> int:
        return len(self._loader)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.__dict__["_loader"], name)


def wrap_in_mp_device_loader(loader: Any, device: torch.device) -> Any:
    """`loader` (yielding host batches) read through MpDeviceLoader onto `device`."""
    return MpDeviceLoaderWrapper(loader, device)
