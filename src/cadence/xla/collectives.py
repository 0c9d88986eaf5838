"""Collectives between XLA replicas, through torch_xla's `xla_model` (called by `cadence.runtime.collectives`
when the process trains on XLA).

Tensors stay on the XLA device. Objects travel as pickled bytes in uint8 tensors padded to the longest
one, so `gather_object` and `broadcast_object_list` work on XLA too (Accelerate raises there).
`reduce(scale=...)` multiplies after the reduction, also on a single device, as documented.
"""

from __future__ import annotations

import pickle
from typing import Any

import torch

from . import runtime as xla_runtime


def _xm() -> Any:
    return xla_runtime.xm()


def gather_one(tensor: torch.Tensor) -> torch.Tensor:
    """Every replica's `tensor` concatenated on dimension 0 (a 0-d tensor counts as one element)."""
    tensor = tensor.detach()
    if tensor.ndim == 0:
        tensor = tensor.clone()[None]
    return _xm().all_gather(tensor, dim=0)


def reduce_one(
    tensor: torch.Tensor, reduction: str, scale: float, num_processes: int
) -> torch.Tensor:
    """Sum (or max) over the replicas, multiplied by `scale`; "mean" then divides by the replica count."""
    result = tensor.clone()
    if num_processes > 1:
        xm = _xm()
        xla_runtime.sync()  # every replica enters the collective with the same pending graph
        op = xm.REDUCE_MAX if reduction == "max" else xm.REDUCE_SUM
        result = xm.all_reduce(op, result, scale=scale)
        xla_runtime.sync()
    elif scale != 1.0:
        result = result * scale
    if reduction == "mean":
        result = result / num_processes
    return result


def broadcast_one(tensor: torch.Tensor, from_process: int) -> torch.Tensor:
    """`tensor` overwritten in place with replica `from_process`'s."""
    _xm().collective_broadcast([tensor], root_ordinal=from_process)
    return tensor


def _to_bytes_tensor(obj: Any, device: Any) -> torch.Tensor:
    data = pickle.dumps(obj)
    return torch.tensor(list(data), dtype=torch.uint8, device=device)


def gather_object(obj: Any, num_processes: int, device: Any) -> list[Any]:
    """Every replica's `obj`, in replica order."""
    payload = _to_bytes_tensor(obj, device)
    sizes = gather_one(torch.tensor([payload.numel()], device=device)).cpu().tolist()
    longest = max(sizes)
    padded = torch.zeros(longest, dtype=torch.uint8, device=device)
    padded[: payload.numel()] = payload
    everyone = gather_one(padded).cpu().view(num_processes, longest)
    return [pickle.loads(bytes(row[:size].tolist())) for row, size in zip(everyone, sizes)]


def broadcast_object_list(object_list: list[Any], from_process: int, device: Any) -> None:
    """Fill `object_list` in place with replica `from_process`'s items."""
    is_source = xla_runtime.global_ordinal() == from_process
    payload = _to_bytes_tensor(object_list if is_source else None, device)
    size = torch.tensor([payload.numel() if is_source else 0], device=device)
    length = int(broadcast_one(size, from_process).cpu().item())
    buffer = torch.zeros(length, dtype=torch.uint8, device=device)
    if is_source:
        buffer.copy_(payload)
    received = pickle.loads(bytes(broadcast_one(buffer, from_process).cpu().tolist()))
    object_list[:] = received
