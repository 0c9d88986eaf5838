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

    Args:
        garbage_collection (bool): Run Python's garbage collector first (default False).
    """
    if garbage_collection:
        gc.collect()
    module = _device_module()
    empty_cache = getattr(module, "empty_cache", None)
    if callable(empty_cache):
        empty_cache()


def release_memory(*objects: Any) -> list[None]:
    """Drop the references to `objects`, collect garbage and empty the device cache.

    Args:
        *objects: The objects to release (models, optimizers, tensors).

    Returns:
        list[None]: One None per object, to assign back so that your names let go too.

    Example:
        >>> import torch
        >>> from cadence.utils import release_memory
        >>> model, optimizer = torch.nn.Linear(2, 2), None
        >>> model, optimizer = release_memory(model, optimizer)
        >>> model is None
        True
    """
    released: list[None] = [None] * len(objects)
    del objects
    clear_device_cache(garbage_collection=True)
    return released


def should_reduce_batch_size(exception: BaseException) -> bool:
    """Whether `exception` says that the device ran out of memory (CUDA, XPU, MPS, NPU, HPU or CPU).

    Args:
        exception (BaseException): The exception.

    Returns:
        bool: True for an out-of-memory error.
    """
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
    """Decorator: call the function with a batch size, and retry with a smaller one each time it runs out of memory.

    The decorated function takes the batch size as its first parameter, and the caller leaves it out.
    After an out-of-memory error (CUDA, XPU, MPS, NPU, HPU or CPU), memory is freed and the function is
    called again with `reduce_batch_size_fn()` (by default 90% of the last batch size, rounded down).
    Other errors propagate. Build the model, optimizer and dataloaders inside the function (with
    `accelerator.free_memory()` first), so that each try starts from scratch.

    Args:
        function (Callable | None): The function; None returns a decorator (written
            `@find_executable_batch_size(starting_batch_size=...)`).
        starting_batch_size (int): The first batch size tried (default 128).
        reduce_batch_size_fn (Callable[[], int] | None): Returns the next batch size to try; None means
            90% of the last one.

    Returns:
        Callable: The wrapped function: its arguments are those of `function` without the batch size,
        and it returns what `function` returns.

    Raises:
        TypeError: The caller passed the batch size as well.
        RuntimeError: The batch size reached 0 without a try that fits.

    Example:
        >>> import torch
        >>> from cadence import find_executable_batch_size
        >>> @find_executable_batch_size(starting_batch_size=128)
        ... def train(batch_size, epochs):
        ...     if batch_size > 100:  # stands for a batch that does not fit in memory
        ...         raise torch.OutOfMemoryError("CUDA out of memory.")
        ...     return batch_size, epochs
        >>> train(3)  # tried 128, 115, 103, then 92
        (92, 3)
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
