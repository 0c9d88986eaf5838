"""join_uneven_inputs: torch's Join for DDP ranks that see different numbers of batches."""

from __future__ import annotations

import contextlib
import warnings
from typing import Any

from ..core.enums import DistributedType

# Torch's Join works with DistributedDataParallel, which Cadence uses on several GPUs and on several CPU
# processes (the reference joins on GPUs only).
_JOINABLE_TYPES = (DistributedType.MULTI_GPU, DistributedType.MULTI_CPU)


@contextlib.contextmanager
def join_uneven_inputs(
    joinables: list[Any],
    even_batches: bool | None,
    *,
    use_distributed: bool,
    dataloaders: list[Any],
    default_even_batches: bool,
    distributed_type: DistributedType = DistributedType.MULTI_CPU,
):
    """Run the block under torch's `Join` when ranks may see different numbers of batches.

    `even_batches` overrides the prepared map-style `dataloaders`' setting inside the block. Other
    backends than DDP (FSDP, DeepSpeed, ...) get a warning and no join, as in Accelerate."""
    if not use_distributed or distributed_type not in _JOINABLE_TYPES:
        if distributed_type != DistributedType.NO:
            warnings.warn(
                "Joining uneven inputs is only supported for multi-GPU training (and, in Cadence, "
                f"several CPU processes) with DDP, not with {getattr(distributed_type, 'value', distributed_type)}: as a result "
                "`join_uneven_inputs` will have no effect.",
                UserWarning,
                stacklevel=3,
            )
        yield
        return
    from torch.distributed.algorithms.join import Join

    restore: list[tuple[Any, bool]] = []
    if even_batches is not None:
        iterable_seen = False
        for loader in dataloaders:
            sampler = getattr(loader, "batch_sampler", None)
            if sampler is None or not hasattr(sampler, "even_batches"):
                iterable_seen = True
                continue
            restore.append((sampler, sampler.even_batches))
            sampler.even_batches = even_batches
        if iterable_seen:  # once, with the reference's key phrase
            warnings.warn(
                "Overriding even_batches is only supported for map-style datasets, yet some "
                "dataloaders given were iterable: they keep their own setting.",
                UserWarning,
                stacklevel=3,
            )
    else:
        even_batches = default_even_batches
    try:
        with Join(joinables, enable=not even_batches, throw_on_early_termination=False):
            yield
    finally:
        for sampler, value in restore:
            sampler.even_batches = value
