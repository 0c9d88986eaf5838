"""What ranks must agree on before a collective: the nesting, dtypes and shapes of its inputs, as text."""

from __future__ import annotations

import zlib
from collections.abc import Callable, Mapping
from typing import Any

import torch

REPORT_LIMIT = 300


def _tensor(tensor: torch.Tensor) -> str:
    return f"{str(tensor.dtype)[6:]}{list(tensor.shape)}"  # "torch.float32" -> "float32"


def _dims(tensor: torch.Tensor) -> str:
    return f"{tensor.ndim}-d"


def _text(data: Any, leaf: Callable[[torch.Tensor], str] = _tensor) -> str:
    if isinstance(data, torch.Tensor):
        return leaf(data)
    if isinstance(data, Mapping):
        return (
            "{" + ", ".join(f"{key!r}: {_text(value, leaf)}" for key, value in data.items()) + "}"
        )
    if isinstance(data, (list, tuple)):
        items = ", ".join(_text(value, leaf) for value in data)
        if hasattr(data, "_fields"):
            return f"{type(data).__name__}({items})"
        return (
            f"[{items}]" if isinstance(data, list) else f"({items}{',' if len(data) == 1 else ''})"
        )
    return "None" if data is None else type(data).__name__


def describe_inputs(data: Any, limit: int | None = REPORT_LIMIT) -> str:
    """E.g. "float32[8, 10]" or "{'x': float32[8, 10], 'y': [int64[8]]}"; cut at `limit` characters."""
    if isinstance(data, torch.Tensor):
        return _tensor(data)
    try:
        text = _text(data)
    except (RuntimeError, ValueError):  # changed while we looked (read from another thread)
        return "<changing>"
    if limit is not None and len(text) > limit:
        text = text[: limit - 3] + "..."
    return text


def describe_dimensions(data: Any) -> str:
    """The nesting with each tensor's number of dimensions only, e.g. "[2-d, {'x': 1-d}]"."""
    return _text(data, _dims)


def signature_hash(text: str) -> int:
    """A hash that is the same in every process (Python's own `hash` of a str is salted per process)."""
    return zlib.crc32(text.encode())


def operation_code(operation: str) -> int:
    """A stable integer code (CRC-32) of the operation name."""
    return zlib.crc32(operation.encode())
