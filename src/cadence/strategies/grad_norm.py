"""Gradient clipping over parameters that may be sharded DTensors on one or several device meshes."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch


def clip_grad_norm_global(
    parameters: Iterable[torch.Tensor],
    max_norm: float,
    norm_type: float = 2.0,
    disjoint_group: Any = None,
) -> torch.Tensor:
    """Clip to the norm of all gradients across all shards; return that norm as a plain tensor.

    Gradients that are DTensors contribute their global norm (a collective over their mesh), so every
    rank computes the same total and scales its shard by the same factor. `disjoint_group`: a process
    group whose ranks hold different parameters (pipeline stages); their norms are combined too.
    """
    from torch.distributed.tensor import DTensor

    params = [p for p in parameters if p.grad is not None]
    by_mesh: dict[object, list[torch.Tensor]] = {}
    plain: list[torch.Tensor] = []
    for p in params:
        if isinstance(p.grad, DTensor):
            by_mesh.setdefault(p.grad.device_mesh, []).append(p)
        else:
            plain.append(p)
    if not params and disjoint_group is None:
        return torch.tensor(0.0)
    groups = list(by_mesh.values()) + ([plain] if plain else [])
    norms = []
    for group in groups:
        norm = torch.nn.utils.get_total_norm([p.grad for p in group], norm_type)
        norms.append(norm.full_tensor() if isinstance(norm, DTensor) else norm)
    if disjoint_group is not None:
        norms = [_combine_across(norms, norm_type, disjoint_group)]
    device = norms[0].device
    total = torch.linalg.vector_norm(torch.stack([n.to(device) for n in norms]), norm_type)
    for mesh, group in by_mesh.items():
        torch.nn.utils.clip_grads_with_norm_(group, max_norm, DTensor.from_local(total, mesh))
    if plain:
        torch.nn.utils.clip_grads_with_norm_(plain, max_norm, total)
    return total


def _combine_across(norms: list[torch.Tensor], norm_type: float, group: Any) -> torch.Tensor:
    """The norm over the ranks of `group`, each holding `norms` of its own parameters."""
    import torch.distributed as dist

    # The group's backend decides the device (gloo: CPU tensors, NCCL: CUDA tensors); the norms are
    # on the gradients' device, which is the one the group runs on.
    local = (
        torch.linalg.vector_norm(torch.stack(norms), norm_type).float()
        if norms
        else torch.zeros(())
    )
    if norm_type == float("inf"):
        dist.all_reduce(local, op=dist.ReduceOp.MAX, group=group)
        return local
    powered = local.double() ** norm_type
    dist.all_reduce(powered, group=group)
    return (powered ** (1.0 / norm_type)).float()
