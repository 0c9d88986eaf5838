"""Looking inside batches: their size, slicing them, describing them for a broadcast, moving them."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from ..runtime.collectives import recursively_apply, send_to_device


@dataclass
class TensorInformation:
    """Shape and dtype of a tensor, enough to allocate the buffer that receives its broadcast.

    Attributes:
        shape (torch.Size): The tensor's shape.
        dtype (torch.dtype): The tensor's element type.
    """

    shape: torch.Size
    dtype: torch.dtype


def is_tensor_information(value: Any) -> bool:
    """Whether `value` is a `TensorInformation` placeholder."""
    return isinstance(value, TensorInformation)


def find_batch_size(data: Any) -> int:
    """Size of the first dimension of the first tensor found in a nested batch.

    Args:
        data (Any): A tensor, or lists, tuples and mappings of them (the first element is followed).

    Returns:
        int: The batch size.

    Raises:
        ValueError: An empty list, tuple or mapping on the way.
        TypeError: The first leaf is not a tensor.
    """
    if isinstance(data, (tuple, list, Mapping)) and len(data) == 0:
        raise ValueError(f"Cannot find the batch size of an empty {type(data).__name__}.")
    if isinstance(data, (tuple, list)):
        return find_batch_size(data[0])
    if isinstance(data, Mapping):
        return find_batch_size(next(iter(data.values())))
    if not isinstance(data, torch.Tensor):
        raise TypeError(f"Can only find the batch size of tensors, got {type(data).__name__}.")
    return data.shape[0]


def ignorant_find_batch_size(data: Any) -> int | None:
    """`find_batch_size`, or None when the batch holds no tensor to measure.

    Args:
        data (Any): A tensor, or lists, tuples and mappings of them.

    Returns:
        int | None: The batch size, or None where `find_batch_size` would raise.
    """
    try:
        return find_batch_size(data)
    except (ValueError, TypeError):
        return None


def slice_tensors(
    data: Any,
    tensor_slice: slice,
    process_index: int | None = None,
    num_processes: int | None = None,
) -> Any:
    """Take `tensor_slice` of every tensor of a nested batch (other leaves are kept whole).

    Args:
        data (Any): A tensor, or lists, tuples and mappings of them.
        tensor_slice (slice): The slice taken along each tensor's first dimension.
        process_index (int | None): Unused; accepted so that this can serve as a dispatcher's
            `slice_fn`.
        num_processes (int | None): Unused, as `process_index`.

    Returns:
        The batch with the same structure, each tensor sliced.
    """
    return recursively_apply(lambda tensor: tensor[tensor_slice], data)


def get_data_structure(data: Any) -> Any:
    """The batch with each tensor replaced by its TensorInformation (other leaves kept).

    Args:
        data (Any): A tensor, or lists, tuples and mappings of them.

    Returns:
        The same structure with a `TensorInformation` in place of each tensor.
    """
    return recursively_apply(lambda tensor: TensorInformation(tensor.shape, tensor.dtype), data)


def initialize_tensors(data_structure: Any, device: Any = None) -> Any:
    """Empty tensors with the shapes and dtypes of a structure from `get_data_structure`.

    Args:
        data_structure (Any): What `get_data_structure` returned.
        device (Any): Where the tensors are allocated; None means torch's default device.

    Returns:
        The same structure with an uninitialised tensor in place of each `TensorInformation`.
    """
    return recursively_apply(
        lambda info: torch.empty(*info.shape, dtype=info.dtype, device=device),
        data_structure,
        test_type=is_tensor_information,
    )


def _on_device(data: Any, device: torch.device) -> bool:
    """Whether every leaf of a batch is a tensor already on `device` (or a plain value)."""
    if isinstance(data, torch.Tensor):
        here = data.device
        # `cpu` and `cpu:0` are the same memory; for other devices the index matters.
        return here.type == device.type and (here.type == "cpu" or here.index == device.index)
    if isinstance(data, (list, tuple)):
        return all(_on_device(item, device) for item in data)
    if isinstance(data, Mapping):
        return all(_on_device(item, device) for item in data.values())
    return not (hasattr(data, "to") and callable(data.to))


def normalized_device(device: Any) -> torch.device:
    """`device` with its index filled in, so it compares equal to a tensor's device."""
    device = torch.device(device)
    if device.type != "cpu" and device.index is None:
        module = getattr(torch, device.type, None)
        current = getattr(module, "current_device", None)
        if current is not None:
            return torch.device(device.type, current())
    return device


def device_mover(sample_batch: Any, device: Any, non_blocking: bool) -> Callable[[Any], Any] | None:
    """How to move batches like `sample_batch` to `device`; None when they are already there.

    Decided once per epoch from its first batch: a dataset gives its batches the same layout every time,
    so per-batch checks would only add cost.
    """
    if device is None:
        return None
    target = normalized_device(device)
    if _on_device(sample_batch, target):
        return None
    return lambda batch: send_to_device(batch, target, non_blocking=non_blocking)
