"""gather_for_metrics: gather evaluation results and drop the samples repeated to even out batches."""

from __future__ import annotations

import warnings
from typing import Any

from ..core.nested import holds_only_tensors
from ..runtime.collectives import gather, gather_object, recursively_apply
from ..runtime.state import GradientState


def gather_for_metrics(input_data: Any, use_gather_object: bool = False) -> Any:
    """Gather `input_data` from every process; on the last batch of a prepared dataloader, keep only
    the real samples (the padding that evened out the processes' batches is dropped).

    Objects that are not tensors (or `use_gather_object=True`) go through `gather_object`.
    """
    use_gather_object = use_gather_object or not holds_only_tensors(input_data)
    data = gather_object(input_data) if use_gather_object else gather(input_data)
    gradient_state = GradientState()
    if not gradient_state.end_of_dataloader:
        return data
    remainder = gradient_state.remainder
    if remainder == -1:
        loader = gradient_state.active_dataloader
        if getattr(loader, "_pads_last_batch", True):
            warnings.warn(
                "gather_for_metrics cannot tell how many samples of this last batch are repeats added "
                "to even out the processes (the dataloader's length or batch size is unknown), so it "
                "returns them all: drop the extra samples yourself, or give the dataset a __len__ and "
                "the batch sampler a batch_size.",
                stacklevel=3,
            )
        return data
    if remainder == 0:
        return data
    if use_gather_object:
        return data[:remainder]
    return recursively_apply(lambda tensor: tensor[:remainder], data)
