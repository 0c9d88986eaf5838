"""DDP communication hooks, including a bf16 compression hook that also works on gloo (CPU)."""

from typing import Any

import torch
import torch.distributed as dist

from ..core.enums import DDPCommunicationHookType


def _compress_hook(dtype: torch.dtype):
    def hook(process_group: Any, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
        group = process_group if process_group is not None else dist.group.WORLD
        buffer = bucket.buffer()
        compressed = buffer.to(dtype).div_(dist.get_world_size(group))
        future = dist.all_reduce(compressed, group=group, async_op=True).get_future()

        def decompress(done: torch.futures.Future[Any]) -> torch.Tensor:
            buffer.copy_(done.value()[0])
            return buffer

        return future.then(decompress)

    hook.__name__ = f"{str(dtype).replace('torch.', '')}_compress_hook"
    return hook


def _compress_wrapper(dtype: torch.dtype, inner: Any):
    def wrapped(state: Any, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
        buffer = bucket.buffer()
        original_dtype = buffer.dtype
        bucket.set_buffer(buffer.to(dtype))
        future = inner(state, bucket)

        def restore(done: torch.futures.Future[Any]) -> torch.Tensor:
            result = done.value()
            result = result[0] if isinstance(result, list) else result
            buffer.copy_(result.to(original_dtype))
            return buffer

        return future.then(restore)

    return wrapped


def register_comm_hook(model: torch.nn.parallel.DistributedDataParallel, handler: Any) -> None:
    """Install the hook asked for by DistributedDataParallelKwargs(comm_hook, comm_wrapper, comm_state_option).

    (No `from __future__ import annotations` here: DDP checks the hooks' annotations as real types.)"""
    if handler is None or handler.comm_hook == DDPCommunicationHookType.NO:
        return
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook

    kind = handler.comm_hook
    state: Any = None
    if kind == DDPCommunicationHookType.FP16:
        hook = _compress_hook(torch.float16)
    elif kind == DDPCommunicationHookType.BF16:
        hook = _compress_hook(torch.bfloat16)
    else:
        state = powerSGD_hook.PowerSGDState(process_group=None, **handler.comm_state_option)
        hook = (
            powerSGD_hook.powerSGD_hook
            if kind == DDPCommunicationHookType.POWER_SGD
            else powerSGD_hook.batched_powerSGD_hook
        )
        if handler.comm_wrapper == DDPCommunicationHookType.FP16:
            hook = _compress_wrapper(torch.float16, hook)
        elif handler.comm_wrapper == DDPCommunicationHookType.BF16:
            hook = _compress_wrapper(torch.bfloat16, hook)
    model.register_comm_hook(state=state, hook=hook)
