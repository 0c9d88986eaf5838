"""Batches that mix tensors with Python objects (strings, ids...), as the dispatcher sends them.

The dispatcher broadcasts a batch's structure as an object and its tensors as tensors, so the objects
travel with the structure. Two kinds of object leaves are told apart:

- a *sample list*: a list or tuple holding no tensor, one entry per sample (what the default collate
  makes of strings). It is cut, concatenated and completed along the batch like a tensor;
- any other object: it belongs to a whole batch. When the batches of several processes are put end
  to end, each process gets back its own batch's object (`PerPart`); when a batch is cut between
  processes, every process gets the object whole.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from ..runtime.collectives import honor_type


class PerPart:
    """The object leaf of each of the batches put end to end into one global batch, in order."""

    __slots__ = ("values",)

    def __init__(self, values: list[Any]) -> None:
        self.values = values

    def __getstate__(self) -> list[Any]:
        return self.values

    def __setstate__(self, values: list[Any]) -> None:
        self.values = values

    def for_process(self, process_index: int) -> Any:
        """The value for `process_index` (the last one for the processes beyond the list)."""
        return self.values[min(process_index, len(self.values) - 1)]


def _holds_tensor(data: Any) -> bool:
    if isinstance(data, torch.Tensor):
        return True
    if isinstance(data, (list, tuple)):
        return any(_holds_tensor(item) for item in data)
    if isinstance(data, Mapping):
        return any(_holds_tensor(item) for item in data.values())
    return False


def is_sample_list(data: Any) -> bool:
    """A list or tuple of per-sample objects (no tensor inside): cut along the batch like a tensor."""
    return (
        isinstance(data, (list, tuple)) and not hasattr(data, "_fields") and not _holds_tensor(data)
    )


def holds_objects(data: Any) -> bool:
    """Whether a batch has any leaf that is not a tensor."""
    if isinstance(data, torch.Tensor):
        return False
    if isinstance(data, (list, tuple)):
        return any(holds_objects(item) for item in data) or len(data) == 0
    if isinstance(data, Mapping):
        return any(holds_objects(item) for item in data.values())
    return True


def samples_in(data: Any) -> int:
    """The batch size: the first dimension of the first tensor, else the length of the first sample
    list (a batch may start with its strings)."""
    found = _first(data, lambda leaf: isinstance(leaf, torch.Tensor))
    if found is not None:
        return found.shape[0] if found.ndim else 1
    found = _first(data, is_sample_list)
    if found is None:
        raise TypeError("This batch holds neither a tensor nor a list of samples: it has no size.")
    return len(found)


def _first(data: Any, test: Any) -> Any:
    if test(data):
        return data
    children = (
        data.values()
        if isinstance(data, Mapping)
        else data
        if isinstance(data, (list, tuple))
        else ()
    )
    for child in children:
        found = _first(child, test)
        if found is not None:
            return found
    return None


def slice_batch(
    data: Any,
    batch_slice: slice,
    process_index: int | None = None,
    num_processes: int | None = None,
) -> Any:
    """Take `batch_slice` of every tensor and sample list; a `PerPart` leaf gives this process's value."""
    if isinstance(data, torch.Tensor):
        return data[batch_slice]
    if is_sample_list(data):
        return type(data)(data[batch_slice])
    if isinstance(data, PerPart):
        return data.for_process(process_index or 0)
    if isinstance(data, (list, tuple)):
        return honor_type(
            data, (slice_batch(item, batch_slice, process_index, num_processes) for item in data)
        )
    if isinstance(data, Mapping):
        return type(data)(
            {
                key: slice_batch(value, batch_slice, process_index, num_processes)
                for key, value in data.items()
            }
        )
    return data


def put_end_to_end(parts: list[Any]) -> Any:
    """One global batch from the batches of several processes: tensors concatenated on dim 0, sample
    lists joined, other objects kept per part."""
    first = parts[0]
    if isinstance(first, torch.Tensor):
        return torch.cat(parts, dim=0)
    if is_sample_list(first):
        return type(first)(item for part in parts for item in part)
    if isinstance(first, (list, tuple)):
        return honor_type(first, (put_end_to_end([p[i] for p in parts]) for i in range(len(first))))
    if isinstance(first, Mapping):
        return type(first)({key: put_end_to_end([p[key] for p in parts]) for key in first})
    return PerPart(list(parts))


def extend_batch(batch: Any, filler: Any, count: int) -> Any:
    """`batch` followed by the first `count` samples of `filler` (its other objects are kept)."""
    if isinstance(batch, torch.Tensor):
        return torch.cat([batch, filler[:count]], dim=0)
    if is_sample_list(batch):
        return type(batch)([*batch, *list(filler)[:count]])
    if isinstance(batch, (list, tuple)):
        return honor_type(
            batch, (extend_batch(b, f, count) for b, f in zip(batch, filler, strict=True))
        )
    if isinstance(batch, Mapping):
        return type(batch)({key: extend_batch(batch[key], filler[key], count) for key in batch})
    return batch


def tensors_of(data: Any) -> list[torch.Tensor]:
    """The tensor leaves of a batch, in a fixed order (what a broadcast sends)."""
    if isinstance(data, torch.Tensor):
        return [data]
    if isinstance(data, (list, tuple)):
        return [tensor for item in data for tensor in tensors_of(item)]
    if isinstance(data, Mapping):
        return [tensor for item in data.values() for tensor in tensors_of(item)]
    return []
