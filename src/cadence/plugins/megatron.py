"""MegatronLMPlugin: accepted so scripts that build one import cleanly; Megatron-LM training itself is
not available in Cadence (the Accelerator says so when the plugin is passed)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class MegatronLMPlugin:
    """Megatron-LM settings (tensor / pipeline parallel degrees, micro-batches, ...). Not supported yet."""

    tp_degree: int = None
    pp_degree: int = None
    num_micro_batches: int = None
    gradient_clipping: float = None
    sequence_parallelism: bool = None
    recompute_activations: bool = None
    use_distributed_optimizer: bool = None
    pipeline_model_parallel_split_rank: int = None
    num_layers_per_virtual_pipeline_stage: int = None
    is_train_batch_min: str = True
    train_iters: int = None
    train_samples: int = None
    weight_decay_incr_style: str = "constant"
    start_weight_decay: float = None
    end_weight_decay: float = None
    lr_decay_style: str = "linear"
    lr_decay_iters: int = None
    lr_decay_samples: int = None
    lr_warmup_iters: int = None
    lr_warmup_samples: int = None
    lr_warmup_fraction: float = None
    min_lr: float = 0
    consumed_samples: list[int] = None
    seq_length: int = None
    encoder_seq_length: int = None
    decoder_seq_length: int = None
    tensorboard_dir: str = None
    set_all_logging_options: bool = False
    eval_iters: int = 100
    eval_interval: int = 1000
    return_logits: bool = False
    other_megatron_args: dict[str, Any] | None = field(default=None)
