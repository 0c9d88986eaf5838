"""Memory helpers: free device caches, drop references, and retry a function with smaller batches
until it fits in memory."""

from __future__ import annotations

import functools
import gc
import inspect
from collections.abc import Callable
from typing import Any

import torch

# Substrings of the messages PyTorch and device plugins raise when an allocation fails.
_OUT_OF_MEMORY_MESSAGES = (
    " out of memory.",  # CUDA, ROCm/HIP, XPU
    "MPS backend out of memory",
    "cuDNN error: CUDNN_STATUS_NOT_SUPPORTED.",  # cuDNN's way of failing big batches
    "DefaultCPUAllocator: can't allocate memory",
    "FATAL ERROR :: MODULE:PT_DEVMEM Allocation failed",  # HPU
    "NPU out of memory",
)


def _device_module() -> Any:
    """The torch module of the accelerator in use (`torch.cuda`, `torch.xpu`, ...), or None."""
    for name in ("xpu", "mlu", "sdaa", "musa", "npu"):
        module = getattr(torch, name, None)
        is_available = getattr(module, "is_available", None)
        if callable(is_available) and is_available():
            return module
    mps = getattr(torch.backends, "mps", None)
    if mps is not None and mps.is_available():
        return torch.mps
    # A process that never initialised CUDA has no CUDA cache to free; `is_available()` would create
    # driver state (and break a later fork) for nothing.
    if torch.cuda.is_initialized():
        return torch.cuda
    return None


def clear_device_cache(garbage_collection: bool = False) -> None:
    """Give the accelerator's cached, unused memory back (`torch.<device>.empty_cache()`).

    `garbage_collection=True` runs `gc.collect()` first, so memory held by unreachable objects is
    freed too (slow: use sparingly).
    """
    if garbage_collection:
        gc.collect()
    module = _device_module()
    empty_cache = getattr(module, "empty_cache", None)
    if callable(empty_cache):
        empty_cache()


def release_memory(*objects: Any) -> list[None]:
    """Drop this function's references to `objects`, collect garbage and empty the device cache.

    Returns a list of `None`, one per object, to assign back: `a, b = release_memory(a, b)`.
    """
    released: list[None] = [None] * len(objects)
    del objects
    clear_device_cache(garbage_collection=True)
    return released


def should_reduce_batch_size(exception: BaseException) -> bool:
    """Whether `exception` says the device (CUDA, XPU, MPS, NPU, HPU or CPU) ran out of memory."""
    out_of_memory = getattr(torch, "OutOfMemoryError", None) or torch.cuda.OutOfMemoryError
    if isinstance(exception, out_of_memory):
        return True
    if isinstance(exception, RuntimeError) and len(exception.args) == 1:
        message = exception.args[0]
        return isinstance(message, str) and any(part in message for part in _OUT_OF_MEMORY_MESSAGES)
    return False


def find_executable_batch_size(
    function: Callable[..., Any] | None = None,
    starting_batch_size: int = 128,
    reduce_batch_size_fn: Callable[[], int] | None = None,
) -> Any:
    """Decorator: call `function(batch_size, *args, **kwargs)`, retrying with a smaller batch size
    each time it runs out of memory.

    `function` takes the batch size as its first parameter; the caller leaves it out. After an
    out-of-memory error, memory is freed and the batch size becomes `reduce_batch_size_fn()` (by
    default 90% of the last one, rounded down). Other errors propagate; reaching 0 raises.

    Example::

        @find_executable_batch_size(starting_batch_size=128)
        def train(batch_size, model, optimizer):
            ...

        train(model, optimizer)
    """
    if function is None:
        return functools.partial(
            find_executable_batch_size,
            starting_batch_size=starting_batch_size,
            reduce_batch_size_fn=reduce_batch_size_fn,
        )

    batch_size = starting_batch_size

    def reduce_by_tenth() -> int:
        return int(batch_size * 0.9)

    next_batch_size = reduce_batch_size_fn or reduce_by_tenth

    @functools.wraps(function)
    def run_with_fitting_batch_size(*args: Any, **kwargs: Any) -> Any:
        nonlocal batch_size
        clear_device_cache(garbage_collection=True)
        parameters = list(inspect.signature(function).parameters)
        if len(parameters) < len(args) + 1:
            passed = ", ".join(f"{name}={value!r}" for name, value in zip(parameters[1:], args[1:]))
            raise TypeError(
                f"Batch size was passed into `{function.__name__}` as the first argument when "
                f"called. Remove it: the decorator passes it. Call `{function.__name__}({passed})`."
            )
        while True:
            if batch_size <= 0:
                raise RuntimeError(
                    "No executable batch size found, reached zero: even the smallest batch ran out "
                    "of memory."
                )
            try:
                return function(batch_size, *args, **kwargs)
            except Exception as error:
                if not should_reduce_batch_size(error):
                    raise
            # Outside the `except`, so the failed try's frames (and their tensors) can be freed.
            clear_device_cache(garbage_collection=True)
            batch_size = next_batch_size()

    return run_with_fitting_batch_size
