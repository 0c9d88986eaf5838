"""Tensor helpers of Accelerate's `operations` module that `cadence.runtime.collectives` does not hold:
fp32 conversion of outputs, `listify`, shape helpers, padding inputs to a multiple of the process
count, copying a tensor held by one process to all, and the debug-mode operation checks.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager, nullcontext
from typing import Any

import torch

from ..data.batches import TensorInformation
from ..diagnostics.errors import DistributedOperationException
from ..precision.policy import convert_outputs_to_fp32
from ..runtime.collectives import (
    CannotPadNestedTensorWarning,
    gather_object,
    is_torch_tensor,
    recursively_apply,
    reduce,
)
from ..runtime.state import AcceleratorState, PartialState

# Dtype codes used to send a tensor's dtype as a number (`gather_tensor_shape`).
TENSOR_TYPE_TO_INT: dict[torch.dtype, int] = {
    torch.float: 1,
    torch.double: 2,
    torch.half: 3,
    torch.bfloat16: 4,
    torch.uint8: 5,
    torch.int8: 6,
    torch.int16: 7,
    torch.int32: 8,
    torch.int64: 9,
    torch.bool: 10,
}
TENSOR_INT_TO_DTYPE: dict[int, torch.dtype] = {
    code: dtype for dtype, code in TENSOR_TYPE_TO_INT.items()
}

# The longest shape `gather_tensor_shape` can carry.
_MAX_SHAPE_SLOTS = 64


def is_torch_xpu_tensor(tensor: Any) -> bool:
    """Whether `tensor` is a tensor on an Intel XPU.

    Args:
        tensor (Any): Any value.

    Returns:
        bool: True for a tensor on an `xpu` device.
    """
    return isinstance(tensor, torch.Tensor) and tensor.device.type == "xpu"


def is_tensor_information(tensor_info: Any) -> bool:
    """Whether `tensor_info` is a `TensorInformation` (shape and dtype of a tensor to create).

    Args:
        tensor_info (Any): Any value.

    Returns:
        bool: True for a `TensorInformation`.
    """
    return isinstance(tensor_info, TensorInformation)


def convert_to_fp32(tensor: Any) -> Any:
    """Every fp16/bf16 tensor in a nested structure converted to fp32; other values unchanged.

    Example:
        >>> convert_to_fp32({"x": torch.ones(1, dtype=torch.half)})["x"].dtype
        torch.float32

    Args:
        tensor (Any): A tensor, or lists, tuples and mappings of them.

    Returns:
        The same structure, half-precision tensors converted.
    """
    return recursively_apply(
        lambda t: t.float(),
        tensor,
        test_type=lambda t: hasattr(t, "dtype") and t.dtype in (torch.float16, torch.bfloat16),
    )


class ConvertOutputsToFp32:
    """A picklable wrapper of a forward function whose fp16/bf16 outputs come back in fp32.

    Example:
        >>> model = torch.nn.Linear(2, 2).half()
        >>> model.forward = ConvertOutputsToFp32(model.forward)

    Args:
        model_forward (Callable[..., Any]): The forward function to wrap.
    """

    def __init__(self, model_forward: Callable[..., Any]) -> None:
        self.model_forward = model_forward
        functools.update_wrapper(self, model_forward)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return convert_to_fp32(self.model_forward(*args, **kwargs))

    def __getstate__(self) -> Any:
        raise TypeError(
            "Cannot pickle a forward wrapped to return fp32 outputs: call "
            "`accelerator.unwrap_model(model, keep_fp32_wrapper=False)` before pickling the model."
        )


def listify(data: Any) -> Any:
    """Every tensor in a nested structure replaced by `tensor.tolist()` (bf16 via fp32).

    Example:
        >>> listify({"a": torch.tensor([1, 2])})
        {'a': [1, 2]}

    Args:
        data (Any): A tensor, or lists, tuples and mappings of them.

    Returns:
        The same structure with Python lists (or numbers, for 0-d tensors) in place of tensors.
    """

    def to_list(tensor: torch.Tensor) -> Any:
        tensor = tensor.detach().cpu()
        if tensor.dtype == torch.bfloat16:
            tensor = tensor.to(torch.float32)  # numpy (behind tolist) has no bf16
        return tensor.tolist()

    return recursively_apply(to_list, data)


def get_shape(data: Any) -> Any:
    """Every tensor in a nested structure replaced by its shape as a list.

    Args:
        data (Any): A tensor, or lists, tuples and mappings of them.

    Returns:
        The same structure with each tensor's shape as a list of ints.
    """
    return recursively_apply(lambda t: list(t.shape), data)


def find_device(data: Any) -> torch.device | None:
    """The device of the first tensor found in a nested structure, or None.

    Args:
        data (Any): A tensor, or lists, tuples and mappings of them.

    Returns:
        torch.device | None: The first tensor's device, or None when there is no tensor.
    """
    if isinstance(data, torch.Tensor):
        return data.device
    if isinstance(data, Mapping):
        data = list(data.values())
    if isinstance(data, (list, tuple)):
        for item in data:
            device = find_device(item)
            if device is not None:
                return device
    return None


def pad_input_tensors(tensor: Any, batch_size: int, num_processes: int, dim: int = 0) -> Any:
    """Zero-pad every tensor of a batch along `dim` so its size is a multiple of `num_processes`
    (at least one row per process), so the batch can be split evenly.

    Example:
        >>> pad_input_tensors(torch.ones(3, 4), batch_size=3, num_processes=2).shape
        torch.Size([4, 4])

    Args:
        tensor (Any): A tensor, or lists, tuples and mappings of them (nothing else).
        batch_size (int): The batch's size along `dim`.
        num_processes (int): The number of processes the batch will be split between.
        dim (int): The dimension to pad (default 0).

    Returns:
        The same structure, each tensor padded with zeros (tensors long enough are unchanged).

    Raises:
        UnsupportedType: A leaf that is not a tensor.
    """

    def pad(t: torch.Tensor) -> torch.Tensor:
        target = max(num_processes, -(-batch_size // num_processes) * num_processes)
        if t.shape[dim] >= target:
            return t
        shape = list(t.shape)
        shape[dim] = target
        padded = t.new_zeros(shape)
        padded.narrow(dim, 0, t.shape[dim]).copy_(t)
        return padded

    return recursively_apply(pad, tensor, error_on_other_type=True)


def _state() -> Any:

    return PartialState()


def gather_tensor_shape(tensor: torch.Tensor | None) -> tuple[torch.Tensor, int]:
    """Shape and dtype code of a tensor that exists on one process only (None elsewhere), known to
    all processes afterwards. Collective: every process calls it.

    Args:
        tensor (torch.Tensor | None): The tensor on the process that holds it; None on the others.

    Returns:
        tuple[torch.Tensor, int]: The shape (as a CPU tensor of sizes) and the dtype's code in
        `TENSOR_TYPE_TO_INT`.

    Raises:
        ValueError: A tensor with more dimensions than the fixed buffer holds.
    """
    state = _state()
    slots = torch.zeros(_MAX_SHAPE_SLOTS + 2, dtype=torch.int64, device=state.device)
    if tensor is not None:
        if tensor.ndim > _MAX_SHAPE_SLOTS:
            raise ValueError(
                f"gather_tensor_shape supports up to {_MAX_SHAPE_SLOTS} dimensions, got {tensor.ndim}."
            )
        slots[0] = tensor.ndim
        slots[1] = TENSOR_TYPE_TO_INT[tensor.dtype]
        slots[2 : 2 + tensor.ndim] = torch.tensor(tensor.shape, dtype=torch.int64)
    slots = reduce(slots, reduction="sum")
    ndim, dtype_code = int(slots[0]), int(slots[1])
    return slots[2 : 2 + ndim].cpu(), dtype_code


def copy_tensor_to_devices(tensor: torch.Tensor | None = None) -> torch.Tensor:
    """Send a tensor held by one process (the others pass None) to every process; unlike
    `broadcast`, the receivers need not know its shape. Collective.

    Args:
        tensor (torch.Tensor | None): The tensor on the one process that holds it; None on all the
            others.

    Returns:
        torch.Tensor: The tensor, on this process's device.
    """
    state = _state()
    shape, dtype_code = gather_tensor_shape(tensor)
    if tensor is None:
        tensor = torch.zeros(tuple(int(s) for s in shape), dtype=TENSOR_INT_TO_DTYPE[dtype_code])
    return reduce(tensor.to(state.device), reduction="sum")


def verify_operation(function: Callable[..., Any]) -> Callable[..., Any]:
    """Decorator for a collective over `tensor`: in debug mode (`ACCELERATE_DEBUG_MODE=1` or
    `CADENCE_DEBUG=1`) every process first compares the shapes it sends and all raise
    `DistributedOperationException` naming the shapes when they differ.

    Args:
        function (Callable[..., Any]): The collective to decorate; its tensor is its first argument or
            `tensor=`.

    Returns:
        Callable[..., Any]: The decorated collective.
    """

    @functools.wraps(function)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        state = _state()
        if not (state.debug and state.use_distributed):
            return function(*args, **kwargs)
        tensor = kwargs["tensor"] if "tensor" in kwargs else args[0]
        shapes = gather_object([get_shape(tensor)])
        if any(shape != shapes[0] for shape in shapes):
            described = "\n  - ".join(
                f"Process {rank}: {shape}" for rank, shape in enumerate(shapes)
            )
            raise DistributedOperationException(
                f"Cannot apply desired operation due to shape mismatches. All shapes across devices must be "
                f"valid.\n\nOperation: `{function.__module__}.{function.__name__}`\nInput shapes:\n  - {described}"
            )
        return function(*args, **kwargs)

    return wrapper


def chained_operation(function: Callable[..., Any]) -> Callable[..., Any]:
    """Decorator for an operation built on other collectives: a `DistributedOperationException`
    raised inside is re-raised naming this operation.

    Args:
        function (Callable[..., Any]): The operation to decorate.

    Returns:
        Callable[..., Any]: The decorated operation.
    """

    @functools.wraps(function)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return function(*args, **kwargs)
        except DistributedOperationException as error:
            raise DistributedOperationException(
                f"Error found while calling `{function.__module__}.{function.__name__}`. Please see the earlier "
                "error for more details."
            ) from error

    return wrapper


@contextmanager
def GatheredParameters(  # noqa: N802 - the reference's public name
    params: Any, modifier_rank: int | None = None, fwd_module: Any = None, enabled: bool = True
) -> Iterator[None]:
    """Inside the block, ZeRO-3 partitioned `params` are whole on every process (DeepSpeed's
    `GatheredParameters`); a no-op without DeepSpeed ZeRO-3.

    Args:
        params (Any): A parameter or an iterable of parameters to gather.
        modifier_rank (int | None): The process whose changes to the parameters inside the block are kept
            and sent to the others; None means the parameters are only read.
        fwd_module (Any): A module whose forward may use the parameters while they are gathered
            (DeepSpeed registers them as external parameters of it).
        enabled (bool): Gather at all (default True); False makes the block a no-op.
    """

    state = AcceleratorState()
    plugin = getattr(state, "deepspeed_plugin", None)
    zero3 = plugin is not None and getattr(plugin, "zero_stage", None) == 3
    if not zero3:
        context: Any = nullcontext()
    else:
        import deepspeed  # optional dependency

        context = deepspeed.zero.GatheredParameters(
            params, modifier_rank=modifier_rank, fwd_module=fwd_module, enabled=enabled
        )
    with context:
        yield


__all__ = [
    "TENSOR_INT_TO_DTYPE",
    "TENSOR_TYPE_TO_INT",
    "CannotPadNestedTensorWarning",
    "ConvertOutputsToFp32",
    "GatheredParameters",
    "chained_operation",
    "convert_outputs_to_fp32",
    "convert_to_fp32",
    "copy_tensor_to_devices",
    "find_device",
    "gather_tensor_shape",
    "get_shape",
    "is_tensor_information",
    "is_torch_tensor",
    "is_torch_xpu_tensor",
    "listify",
    "pad_input_tensors",
    "verify_operation",
]
