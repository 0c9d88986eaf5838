"""The cross-group gradient average: the gradients flattened into buckets, each averaged across
the quorum (cross_group.py; a failed collective is left to the commit vote).

Under FSDP2 a gradient is a DTensor sharded over the group's ranks; its local shard is what is
averaged: the Manager's process group of rank r joins rank r of every group (torchft keys its
store by group rank), and rank r of every group holds the same shard (the groups have the same
process count), so the shards average as the full gradients would."""

from __future__ import annotations

from collections.abc import Iterable

import torch

from .cross_group import CrossGroupReduce, Finish, StepQuorum

# As DDP's default bucket: large enough to amortise a collective, small enough to overlap copies.
BUCKET_BYTES = 25 * 1024 * 1024
# A gradient this large is reduced in place, alone: flattening it would copy it twice (in and
# back) for a collective it amortises by itself (the size of DDP's first bucket).
ALONE_BYTES = 1024 * 1024


def local_gradient(grad: torch.Tensor) -> torch.Tensor:
    """The part of `grad` this process holds: a DTensor's local shard (a view: writing it writes
    the gradient), any other tensor as it is."""
    to_local = getattr(grad, "to_local", None)  # DTensor's; a plain tensor has none
    return to_local() if callable(to_local) else grad


def reduced_in_place(grad: torch.Tensor, device: torch.device | None = None) -> bool:
    """Whether `grad` is averaged where it lies, as a bucket of its own: contiguous, of
    `ALONE_BYTES` or more, and (when `device` is given) on the collective's device."""
    large = grad.numel() * grad.element_size() >= ALONE_BYTES and grad.is_contiguous()
    return large and (device is None or grad.device == device)


def gradient_buckets(
    parameters: Iterable[torch.nn.Parameter], bucket_bytes: int = BUCKET_BYTES
) -> list[list[torch.Tensor]]:
    """The parameters' local gradients (see `local_gradient`) grouped by dtype and device, each
    group cut at `bucket_bytes`; a contiguous gradient of `ALONE_BYTES` or more is a bucket of
    its own."""
    groups: dict[tuple[torch.dtype, torch.device], list[list[torch.Tensor]]] = {}
    sizes: dict[tuple[torch.dtype, torch.device], int] = {}
    for parameter in parameters:
        if parameter.grad is None:
            continue
        grad = local_gradient(parameter.grad)
        key = (grad.dtype, grad.device)
        buckets = groups.setdefault(key, [[]])
        nbytes = grad.numel() * grad.element_size()
        if reduced_in_place(grad):
            buckets.insert(len(buckets) - 1, [grad])  # before the bucket still filling
            continue
        if buckets[-1] and sizes.get(key, 0) + nbytes > bucket_bytes:
            buckets.append([])
            sizes[key] = 0
        buckets[-1].append(grad)
        sizes[key] = sizes.get(key, 0) + nbytes
    return [bucket for buckets in groups.values() for bucket in buckets if bucket]


def average_across_groups(
    reduce: CrossGroupReduce,
    quorum: StepQuorum,
    parameters: Iterable[torch.nn.Parameter],
    membership: torch.Tensor,
    device: torch.device | None = None,
    started: dict[int, Finish] | None = None,
) -> torch.Tensor:
    """Average the gradients of `parameters` over the participants of `quorum`, in place.

    A bucket of one large contiguous gradient on the collective's device is reduced where it
    lies; other gradients are flattened together (one copy in, one copy back), as DDP's buckets
    are. `membership` (this group's share row) rides in the first flattened float32 bucket, so
    the quorum's members are learnt without a collective of their own; returns its average. All
    buckets are started before any is waited for. Buckets travel on `device` (the cross-group
    backend's) when given: gradients FSDP2 offloads to the CPU are copied there and back.
    `started` holds the averages already started during the backward pass (parameter id ->
    its finish): those gradients are left out of the buckets and waited for first.
    """
    started = started or {}
    buckets = gradient_buckets(p for p in parameters if id(p) not in started)
    flats: list[torch.Tensor] = []
    carried = False
    for bucket in buckets:
        grad = bucket[0]
        if len(bucket) == 1 and reduced_in_place(grad, device):
            flats.append(grad)  # reduced in place: no copy of the largest gradients
            continue
        flat = torch.cat([grad.reshape(-1) for grad in bucket])
        if device is not None:
            flat = flat.to(device)
        if not carried and flat.dtype == torch.float32:
            flat = torch.cat([flat, membership.to(flat.device)])
            carried = True
        flats.append(flat)
    if not carried:
        flats.append(membership.to(device) if device is not None else membership.clone())
    finishes = [*started.values(), *(reduce.start(flat, quorum) for flat in flats)]
    for finish in finishes:
        finish()
    averaged_membership = None
    for bucket, flat in zip(buckets, flats):
        if flat is bucket[0]:
            continue
        offset = 0
        for grad in bucket:
            count = grad.numel()
            grad.copy_(flat[offset : offset + count].view_as(grad))
            offset += count
        if averaged_membership is None and flat.numel() > offset:
            averaged_membership = flat[offset:].cpu()
    if averaged_membership is None:
        averaged_membership = flats[-1].cpu()
    return averaged_membership
