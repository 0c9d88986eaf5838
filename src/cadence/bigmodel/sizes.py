"""Byte sizes of dtypes, tensors and modules, the inputs of every device-map computation.

Sizes are computed from shapes and dtypes only, so they work on a model built on the meta device.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Iterator
from typing import Optional, Union

import torch
from torch import nn

_SIZE_ERROR = "`size` {size} is not in a valid format. Use an integer for bytes, or a string with an unit (like '5.0GB')."
# name suffix -> (bytes per unit, whether a lower-case trailing "b" means bits)
_UNITS = (
    ("GIB", 2**30, False),
    ("MIB", 2**20, False),
    ("KIB", 2**10, False),
    ("GB", 10**9, True),
    ("MB", 10**6, True),
    ("KB", 10**3, True),
)


def convert_file_size_to_int(size: Union[int, str]) -> int:
    """Bytes in `size`: an int, or a string like "5GB" (decimal), "5GiB" (binary) or "5Gb" (bits).

    Example:
        >>> convert_file_size_to_int("1MiB")
        1048576

    Args:
        size (int | str): A non-negative number of bytes, or a number with a unit.

    Returns:
        int: The number of bytes.

    Raises:
        ValueError: A negative number, or text without a known unit.
    """
    if isinstance(size, bool) or not isinstance(size, (int, str)):
        raise ValueError(_SIZE_ERROR.format(size=size))
    if isinstance(size, int):
        if size < 0:
            raise ValueError(_SIZE_ERROR.format(size=size))
        return size
    upper = size.upper()
    for suffix, unit, bits_if_lower_b in _UNITS:
        if upper.endswith(suffix):
            try:
                value = int(float(size[: -len(suffix)]) * unit)
            except ValueError:
                raise ValueError(_SIZE_ERROR.format(size=size)) from None
            if bits_if_lower_b and size.endswith("b"):
                value //= 8  # "Gb" is gigabits
            if value < 0:
                break
            return value
    raise ValueError(_SIZE_ERROR.format(size=size))


def dtype_byte_size(dtype: torch.dtype) -> Union[int, float]:
    """Bytes taken by one element of `dtype` (1/8 for bool, as Accelerate counts it).

    Example:
        >>> dtype_byte_size(torch.float32)
        4

    Args:
        dtype (torch.dtype): The element type.

    Returns:
        int | float: Its size in bytes.

    Raises:
        ValueError: A dtype whose name gives no bit width.
    """
    if dtype == torch.bool:
        return 1 / 8
    if isinstance(dtype, torch.dtype) and str(dtype).startswith("torch.float8_"):
        return 1
    # "torch.float16" -> 16 bits; "torch.complex64" -> 64 bits
    bits = re.search(r"[^\d](\d+)$", str(dtype))
    if bits is None:
        raise ValueError(f"`dtype` is not a valid dtype: {dtype}.")
    return int(bits.group(1)) // 8


def get_non_persistent_buffers(
    module: nn.Module, recurse: bool = False, fqns: bool = False
) -> set[str]:
    """Names of the buffers registered with `persistent=False` (not in the state dict).

    With `recurse=True` the submodules' ones are included, prefixed by their path when `fqns=True`.

    Args:
        module (nn.Module): The module to inspect.
        recurse (bool): Include the submodules' buffers (default False).
        fqns (bool): Name the submodules' buffers by their full path (default False: their own name).

    Returns:
        set[str]: The buffer names.
    """
    names = set(module._non_persistent_buffers_set)
    if recurse:
        for prefix, child in module.named_modules():
            if prefix == "":
                continue
            for name in child._non_persistent_buffers_set:
                names.add(f"{prefix}.{name}" if fqns else name)
    return names


def named_module_tensors(
    module: nn.Module,
    include_buffers: bool = True,
    recurse: bool = False,
    remove_non_persistent: bool = False,
) -> Iterator[tuple[str, torch.Tensor]]:
    """The parameters, then (with `include_buffers`) the buffers of `module`, with their names.

    Example:
        >>> dict(named_module_tensors(torch.nn.BatchNorm1d(2))).keys()
        dict_keys(['weight', 'bias', 'running_mean', 'running_var', 'num_batches_tracked'])

    Args:
        module (nn.Module): The module to read.
        include_buffers (bool): Yield the buffers too (default True).
        recurse (bool): Include the submodules' tensors, by full path (default False).
        remove_non_persistent (bool): Leave out buffers that are not in the state dict (default False).

    Yields:
        tuple[str, torch.Tensor]: Each name and tensor.
    """
    yield from module.named_parameters(recurse=recurse)
    if include_buffers:
        skip = (
            get_non_persistent_buffers(module, recurse=recurse, fqns=True)
            if remove_non_persistent
            else set()
        )
        for name, buffer in module.named_buffers(recurse=recurse):
            if name not in skip:
                yield name, buffer


def as_dtype(dtype: Union[str, torch.dtype, None]) -> Optional[torch.dtype]:
    """`dtype` as a torch.dtype: "float16", "torch.float16" and torch.float16 are the same."""
    if isinstance(dtype, str):
        found = getattr(torch, dtype.replace("torch.", ""), None)
        if not isinstance(found, torch.dtype):
            raise ValueError(
                f"dtype {dtype!r} is not a torch dtype; use e.g. 'float16' or torch.float16."
            )
        return found
    return dtype


def is_integer_dtype(dtype: torch.dtype) -> bool:
    """True for integer and bool dtypes (never cast when a dtype is applied to a model)."""
    return str(dtype).startswith(("torch.uint", "torch.int", "torch.bool"))


def compute_module_sizes(
    model: nn.Module,
    dtype: Union[str, torch.dtype, None] = None,
    special_dtypes: Optional[dict[str, Union[str, torch.dtype]]] = None,
    buffers_only: bool = False,
) -> dict[str, int]:
    """Bytes of every submodule (key "" is the whole model), counting each tensor once.

    With `dtype`, floating-point tensors are counted at the smaller of their dtype and `dtype`
    (integer tensors keep theirs); `special_dtypes` gives the dtype of named tensors.

    Example:
        >>> dict(compute_module_sizes(torch.nn.Linear(4, 4)))
        {'': 80, 'weight': 64, 'bias': 16}

    Args:
        model (nn.Module): The model to measure.
        dtype (str | torch.dtype | None): Count floating-point tensors at no more than this dtype's size
            (the dtype the model will be loaded in); None counts them as they are.
        special_dtypes (dict[str, str | torch.dtype] | None): The dtype of particular tensors, by full
            name, overriding `dtype`.
        buffers_only (bool): Count the buffers only (default False).

    Returns:
        dict[str, int]: Bytes by module or tensor name.
    """
    dtype = as_dtype(dtype)
    special_sizes = {k: dtype_byte_size(as_dtype(v)) for k, v in (special_dtypes or {}).items()}
    target_size = dtype_byte_size(dtype) if dtype is not None else None
    sizes: dict[str, int] = defaultdict(int)
    tensors = (
        model.named_buffers(recurse=True)
        if buffers_only
        else named_module_tensors(model, recurse=True)
    )
    for name, tensor in tensors:
        if name in special_sizes:
            size = tensor.numel() * special_sizes[name]
        elif target_size is None or is_integer_dtype(tensor.dtype):
            size = tensor.numel() * dtype_byte_size(tensor.dtype)
        else:
            size = tensor.numel() * min(target_size, dtype_byte_size(tensor.dtype))
        parts = name.split(".")
        for depth in range(len(parts) + 1):
            sizes[".".join(parts[:depth])] += size
    return sizes


def compute_module_total_buffer_size(
    model: nn.Module,
    dtype: Union[str, torch.dtype, None] = None,
    special_dtypes: Optional[dict[str, Union[str, torch.dtype]]] = None,
) -> int:
    """Bytes of all the buffers of `model` (what must stay on the execution device when only
    parameters are offloaded).

    Args:
        model (nn.Module): The model to measure.
        dtype (str | torch.dtype | None): Count floating-point tensors at no more than this dtype's size
            (the dtype the model will be loaded in); None counts them as they are.
        special_dtypes (dict[str, str | torch.dtype] | None): The dtype of particular tensors, by full
            name, overriding `dtype`.

    Returns:
        int: The buffers' bytes.
    """
    return compute_module_sizes(model, dtype, special_dtypes, buffers_only=True).get("", 0)


def get_max_layer_size(
    modules: list[tuple[str, nn.Module]],
    module_sizes: dict[str, int],
    no_split_module_classes: list[str],
) -> tuple[int, list[str]]:
    """The biggest "layer" among `modules` and the names of the layers of that size.

    A layer is a module with no children or whose class is in `no_split_module_classes` (it cannot
    be split over devices); other modules are opened up. Parameters given as (name, tensor) count
    as layers too.

    Example:
        >>> model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 8))
        >>> get_max_layer_size(list(model.named_children()), compute_module_sizes(model), [])
        (160, ['1'])

    Args:
        modules (list[tuple[str, nn.Module]]): Named modules (or tensors) to look through.
        module_sizes (dict[str, int]): Bytes by name, as `compute_module_sizes` returns them.
        no_split_module_classes (list[str]): Class names of modules that must stay whole.

    Returns:
        tuple[int, list[str]]: The biggest layer's bytes and the names of the layers of that size.
    """
    max_size = 0
    layer_names: list[str] = []
    queue = list(modules)
    while queue:
        name, module = queue.pop(0)
        children = list(module.named_children()) if isinstance(module, nn.Module) else []
        if not children or module.__class__.__name__ in (no_split_module_classes or []):
            size = module_sizes[name]
            if size > max_size:
                max_size, layer_names = size, [name]
            elif size == max_size:
                layer_names.append(name)
        else:
            prefix = f"{name}." if name else ""
            queue = [(f"{prefix}{n}", m) for n, m in children] + queue
    return max_size, layer_names


def get_module_leaves(module_sizes: dict[str, int]) -> list[str]:
    """Names in `module_sizes` that no other name extends (the tensors and childless modules).

    Args:
        module_sizes (dict[str, int]): Bytes by name, as `compute_module_sizes` returns them.

    Returns:
        list[str]: The leaf names, in the mapping's order.
    """
    leaves = []
    for name in module_sizes:
        if name == "":
            continue
        if not any(other.startswith(name + ".") for other in module_sizes if other != name):
            leaves.append(name)
    return leaves


def calculate_maximum_sizes(model: nn.Module) -> tuple[int, tuple[int, list[str]]]:
    """(total bytes of `model`, (bytes of its biggest layer, that layer's names)).

    Args:
        model (nn.Module): The model to measure.

    Returns:
        tuple[int, tuple[int, list[str]]]: The model's bytes, and the biggest layer's bytes with the
        names of the layers of that size.
    """
    sizes = compute_module_sizes(model)
    no_split = getattr(model, "_no_split_modules", None) or []
    modules = (
        list(model.named_parameters(recurse=False))
        + list(model.named_children())
        + list(model.named_buffers(recurse=False))
    )
    return sizes[""], get_max_layer_size(modules, sizes, no_split)
