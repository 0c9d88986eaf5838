"""join_uneven_inputs: torch's Join for DDP ranks that see different numbers of batches."""

from __future__ import annotations

import contextlib
import warnings
from typing import Any


@contextlib.contextmanager
def join_uneven_inputs(
    joinables: list[Any],
    even_batches: bool | None,
    *,
    use_distributed: bool,
    dataloaders: list[Any],
    default_even_batches: bool,
):
    """Run the block under torch's `Join` when ranks may see different numbers of batches.

    `even_batches` overrides the prepared map-style `dataloaders`' setting inside the block."""
    if not use_distributed:
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
