"""`gather_for_metrics` across the replica groups: the samples of one global step, each once.

Within a step the quorum's participating ranks hold consecutive slices of the epoch's order (the
exactly-once cursor, loader.py), so the step's global batch is their slices in participating order.
Each rank writes its bytes into its own row of a zeroed buffer (one row per participating rank);
a sum over the group's ranks (torch.distributed) and then over the groups (torchft's Manager, SUM)
leaves every row filled on every rank. Adding zeros to bytes changes none, so the result is exact
for every dtype. The cursor never pads the epoch's tail (it shares it out, one sample apart at
most), so there is no repeated sample to drop: the last step returns the tail, each sample once.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable
from typing import Any

import torch

from ..core.nested import holds_only_tensors, recursively_apply
from .loader import StepView

# Dimensions a gathered tensor may have (the shape header has a fixed width per tensor).
MAX_DIMS = 8


def _leaves(data: Any) -> list[torch.Tensor]:
    found: list[torch.Tensor] = []

    def keep(tensor: torch.Tensor) -> torch.Tensor:
        found.append(tensor)
        return tensor

    recursively_apply(keep, data)
    return found


def _as_rows(tensor: torch.Tensor) -> torch.Tensor:
    """A tensor with a first dimension to concatenate along (a 0-dim one becomes one row, as
    Accelerate's gather does)."""
    tensor = tensor.detach()
    return tensor[None] if tensor.dim() == 0 else tensor


def _to_bytes(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.contiguous().cpu().reshape(-1).view(torch.uint8)


def gather_step(
    data: Any,
    use_gather_object: bool,
    *,
    view: StepView,
    sum_in_group: Callable[[torch.Tensor], None],
    sum_across_groups: Callable[[torch.Tensor], None],
) -> Any:
    """Every participating rank's `data` of this step, in participating order.

    Tensors (nested in lists, tuples, dicts) are concatenated along their first dimension; other
    objects (or `use_gather_object=True`) are gathered as objects, lists concatenated, as
    Accelerate's `gather_object` does. Tensors come back on the device of the first leaf.

    Args:
        data: this rank's results for the step's batch.
        use_gather_object: gather as Python objects even when `data` holds only tensors.
        view: the open step (participating ranks, this rank's index).
        sum_in_group: sums a CPU tensor in place over this replica group's ranks.
        sum_across_groups: sums a CPU tensor in place over the quorum's groups (raises when a
            group was lost during it: the rows would be incomplete).
    """
    as_objects = use_gather_object or not holds_only_tensors(data)
    if as_objects:
        leaves = [torch.frombuffer(bytearray(pickle.dumps(data)), dtype=torch.uint8)]
    else:
        leaves = [_as_rows(tensor) for tensor in _leaves(data)]
    if view.participants == 1:  # as Accelerate's gather on one process: the data itself
        return data
    if any(tensor.dim() > MAX_DIMS for tensor in leaves):
        raise ValueError(
            f"gather_for_metrics under fault tolerance gathers tensors of at most {MAX_DIMS} "
            "dimensions; reshape the results first"
        )
    # Phase 1: every rank's shapes (row: for each leaf its dimension count, then its sizes).
    width = len(leaves) * (1 + MAX_DIMS)
    shapes = torch.zeros(view.participants, width, dtype=torch.int64)
    for position, tensor in enumerate(leaves):
        base = position * (1 + MAX_DIMS)
        shapes[view.index, base] = tensor.dim()
        shapes[view.index, base + 1 : base + 1 + tensor.dim()] = torch.tensor(tensor.shape)
    sum_in_group(shapes)
    sum_across_groups(shapes)
    # Phase 2: the bytes, one row per participating rank, as long as the longest.
    payload = [_to_bytes(tensor) for tensor in leaves]
    lengths = []
    for rank in range(view.participants):
        total = 0
        for position, tensor in enumerate(leaves):
            base = position * (1 + MAX_DIMS)
            dims = int(shapes[rank, base])
            if dims != tensor.dim():
                raise ValueError(
                    f"gather_for_metrics: participating rank {rank} passed a tensor of {dims} "
                    f"dimensions where rank {view.index} has {tensor.dim()}: every rank must pass "
                    "results of the same structure"
                )
            count = int(torch.prod(shapes[rank, base + 1 : base + 1 + dims]).item()) if dims else 1
            total += count * tensor.element_size()
        lengths.append(total)
    rows = torch.zeros(view.participants, max(max(lengths), 1), dtype=torch.uint8)
    if payload:
        mine = torch.cat(payload)
        rows[view.index, : mine.numel()] = mine
    sum_in_group(rows)
    sum_across_groups(rows)
    # Each rank's leaves back out of its row.
    per_rank: list[list[torch.Tensor]] = []
    for rank in range(view.participants):
        offset, rebuilt = 0, []
        for position, tensor in enumerate(leaves):
            base = position * (1 + MAX_DIMS)
            shape = [int(d) for d in shapes[rank, base + 1 : base + 1 + tensor.dim()]]
            count = (int(torch.tensor(shape).prod().item()) if shape else 1) * tensor.element_size()
            chunk = rows[rank, offset : offset + count].clone()
            rebuilt.append(chunk.view(tensor.dtype).reshape(shape))
            offset += count
        per_rank.append(rebuilt)
    if as_objects:
        everyone = [pickle.loads(bytes(parts[0].numpy().tobytes())) for parts in per_rank]
        if all(isinstance(o, (list, tuple)) for o in everyone):
            return [item for part in everyone for item in part]
        return everyone
    device = leaves[0].device if leaves else torch.device("cpu")
    joined = iter(
        torch.cat([parts[position] for parts in per_rank]).to(device)
        for position in range(len(leaves))
    )
    return recursively_apply(lambda _tensor: next(joined), data)
