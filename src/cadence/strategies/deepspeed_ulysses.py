"""DeepSpeed Ulysses sequence parallelism (`ParallelismConfig(sp_size=N, sp_backend="deepspeed")`):
the groups DeepSpeed's engine is built with, the batch size it is told, the model check, and the
dataloader adapter that splits each sample over the sequence-parallel group."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch

# Layer types whose attention is not softmax attention over the whole sequence: Ulysses' all-to-all
# would hand them a head split they cannot use, so such models are refused.
_LINEAR_ATTENTION_LAYER_TYPES = ("linear_attention",)


def check_model(model: Any, sp_size: int) -> None:
    """Refuse models Ulysses cannot split: no transformers config, or linear-attention layers."""
    config = getattr(model, "config", None)
    if config is None or not hasattr(config, "get_text_config"):
        raise ValueError(
            f"Sequence parallelism (sp_size={sp_size}) through DeepSpeed Ulysses needs a transformers "
            f"model (it replaces the model's attention function); got {type(model).__name__}. Use "
            "context parallelism (cp_size) for other models."
        )
    layer_types = getattr(config.get_text_config(), "layer_types", None) or []
    linear = sorted({t for t in layer_types if t in _LINEAR_ATTENTION_LAYER_TYPES})
    if linear:
        raise ValueError(
            f"Sequence parallelism (sp_size={sp_size}) cannot run this model: its layers include "
            f"{', '.join(linear)}, which DeepSpeed Ulysses cannot split over attention heads. Set sp_size=1."
        )


def register(model: Any, sp_size: int, handler: Any, micro_batch_size: int) -> Any:
    """Route the model's attention through Ulysses; returns the mpu for `deepspeed.initialize`."""
    from deepspeed.runtime.sequence_parallel.ulysses_sp import UlyssesSPAttentionHF

    return UlyssesSPAttentionHF.register_with_transformers(
        model_name_or_path=model,
        # Unset, it is the model's own attention (DeepSpeed refuses a mismatch anyway).
        core_attn_implementation=handler.sp_attn_implementation
        or getattr(model.config, "_attn_implementation", None),
        sequence_parallel_size=sp_size,
        micro_batch_size=micro_batch_size,
        seq_length=handler.sp_seq_length,
        seq_length_is_variable=handler.sp_seq_length_is_variable,
    )


class _WithPositions:
    """The wrapped loader's batches, each checked for `position_ids` before the adapter splits it."""

    def __init__(self, loader: Any) -> None:
        self.loader = loader

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self) -> Iterator[Any]:
        for batch in self.loader:
            if not isinstance(batch, dict) or "position_ids" not in batch:
                rank = torch.distributed.get_rank()
                keys = sorted(batch) if isinstance(batch, dict) else type(batch).__name__
                raise ValueError(
                    f"[rank {rank}] Sequence parallelism (DeepSpeed Ulysses) needs position_ids in every "
                    f"batch, got {keys}: each rank holds a slice of the sequence and needs the tokens' "
                    "global positions. Add position_ids to the batches (torch.arange(seq_len) per "
                    "sample; for packed sequences, restarting at each document)."
                )
            yield batch


class UlyssesLoader:
    """A prepared loader as the sequence-parallel ranks read it, through DeepSpeed's
    `UlyssesSPDataLoaderAdapter`: each batch is one rank's sample split over the sp group (the batches
    need `position_ids`; `labels` become `shift_labels`), so one pass yields sp_size times as many
    batches. It reports the end of the data to GradientState itself: the wrapped loader reaches its last
    batch sp_size micro-batches early, which would end gradient accumulation too soon."""

    remainder = -1

    def __init__(self, loader: Any, mpu: Any, device: torch.device, gradient_state: Any) -> None:
        self.loader = loader
        self.mpu = mpu
        self.device = device
        self.gradient_state = gradient_state
        self.end_of_dataloader = False

    def __len__(self) -> int:
        return len(self.loader) * self.mpu.get_sequence_parallel_world_size()

    def __iter__(self) -> Iterator[Any]:
        from deepspeed.runtime.sequence_parallel.ulysses_sp import UlyssesSPDataLoaderAdapter

        adapter = UlyssesSPDataLoaderAdapter(
            _WithPositions(self.loader),
            sp_rank=self.mpu.get_sequence_parallel_rank(),
            sp_group=self.mpu.get_sequence_parallel_group(),
            sp_world_size=self.mpu.get_sequence_parallel_world_size(),
            device=self.device,
        )
        self.end_of_dataloader = False
        registered = False
        try:
            while True:
                try:
                    batch = next(adapter)
                except StopIteration:
                    return
                if (
                    not registered
                ):  # after the wrapped loader's own registration: this one is active
                    self.gradient_state._add_dataloader(self)
                    registered = True
                self.end_of_dataloader = bool(
                    getattr(self.loader, "end_of_dataloader", False) and not adapter.micro_batches
                )
                yield batch
        finally:
            if registered:
                self.gradient_state._remove_dataloader(self)

    def __getattr__(self, name: str) -> Any:
        # set_epoch, batch_size, dataset ...: the wrapped loader's
        if name == "loader":
            raise AttributeError(name)
        return getattr(self.loader, name)
