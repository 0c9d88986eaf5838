"""MegatronLMPlugin: accepted so scripts that build one import cleanly; Megatron-LM training itself is
not available in Cadence (the Accelerator says so when the plugin is passed)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class MegatronLMPlugin:
    """Megatron-LM settings (tensor / pipeline parallel degrees, micro-batches, ...). Not supported yet.

    The fields and their order are the reference's, so scripts that build one keep working.
    """

    tp_degree: Any = None
    pp_degree: Any = None
    use_custom_fsdp: Any = None
    overlap_cpu_optimizer_d2h_h2d: Any = None
    no_load_optim: Any = None
    eod_mask_loss: Any = None
    no_save_optim: Any = None
    optimizer_cpu_offload: Any = None
    use_precision_aware_optimizer: Any = None
    decoder_last_pipeline_num_layers: Any = None
    recompute_granularity: Any = None
    recompute_method: Any = None
    recompute_num_layers: Any = None
    attention_backend: Any = None
    expert_model_parallel_size: Any = None
    context_parallel_size: Any = None
    attention_dropout: Any = None
    hidden_dropout: Any = None
    attention_softmax_in_fp32: Any = None
    expert_tensor_parallel_size: Any = None
    calculate_per_token_loss: Any = None
    use_rotary_position_embeddings: Any = None
    num_micro_batches: Any = None
    gradient_clipping: Any = None
    sequence_parallelism: Any = None
    recompute_activations: Any = None
    use_distributed_optimizer: Any = None
    pipeline_model_parallel_split_rank: Any = None
    num_layers_per_virtual_pipeline_stage: Any = None
    is_train_batch_min: Any = True
    train_iters: Any = None
    train_samples: Any = None
    weight_decay_incr_style: Any = "constant"
    start_weight_decay: Any = None
    end_weight_decay: Any = None
    lr_decay_style: Any = "linear"
    lr_decay_iters: Any = None
    lr_decay_samples: Any = None
    lr_warmup_iters: Any = None
    lr_warmup_samples: Any = None
    lr_warmup_fraction: Any = None
    min_lr: Any = 0
    consumed_samples: Any = None
    no_wd_decay_cond: Any = None
    scale_lr_cond: Any = None
    lr_mult: Any = 1.0
    megatron_dataset_flag: Any = False
    seq_length: Any = None
    encoder_seq_length: Any = None
    decoder_seq_length: Any = None
    tensorboard_dir: Any = None
    set_all_logging_options: Any = False
    eval_iters: Any = 100
    eval_interval: Any = 1000
    return_logits: Any = False
    custom_train_step_class: Any = None
    custom_train_step_kwargs: Any = None
    custom_model_provider_function: Any = None
    custom_prepare_model_function: Any = None
    custom_megatron_datasets_provider_function: Any = None
    custom_get_batch_function: Any = None
    custom_loss_function: Any = None
    other_megatron_args: dict[str, Any] | None = field(default=None)
