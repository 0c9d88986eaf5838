"""MegatronLMPlugin: accepted so scripts that build one import cleanly; Megatron-LM training itself is
not available in Cadence (the Accelerator says so when the plugin is passed)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class MegatronLMPlugin:
    """Megatron-LM settings (tensor / pipeline parallel degrees, micro-batches, ...). Not supported yet.

    The fields and their order are Accelerate's, so scripts that build one keep working.

    Attributes:
        tp_degree (Any): Tensor-parallel degree.
        pp_degree (Any): Pipeline-parallel degree.
        use_custom_fsdp (Any): Use Megatron-LM's own FSDP.
        overlap_cpu_optimizer_d2h_h2d (Any): Overlap the device-host copies of a CPU-offloaded
            optimizer with compute.
        no_load_optim (Any): Do not load the optimizer state from a checkpoint.
        eod_mask_loss (Any): Leave end-of-document tokens out of the loss.
        no_save_optim (Any): Do not save the optimizer state in checkpoints.
        optimizer_cpu_offload (Any): Keep the optimizer state on the CPU.
        use_precision_aware_optimizer (Any): Use the optimizer that keeps its states in reduced
            precision.
        decoder_last_pipeline_num_layers (Any): The number of decoder layers on the last
            pipeline stage.
        recompute_granularity (Any): Activation recomputation: "full" or "selective".
        recompute_method (Any): How full recomputation picks layers: "uniform" or "block".
        recompute_num_layers (Any): The number of layers recomputed (per group or per stage).
        attention_backend (Any): The attention implementation.
        expert_model_parallel_size (Any): Expert-parallel degree (mixture of experts).
        context_parallel_size (Any): Context-parallel degree (the sequence split over
            processes).
        attention_dropout (Any): Dropout probability of the attention weights.
        hidden_dropout (Any): Dropout probability of the hidden states.
        attention_softmax_in_fp32 (Any): Compute the attention softmax in fp32.
        expert_tensor_parallel_size (Any): Tensor-parallel degree inside the experts.
        calculate_per_token_loss (Any): Average the loss over tokens rather than over micro-
            batches.
        use_rotary_position_embeddings (Any): Use rotary position embeddings.
        num_micro_batches (Any): The number of micro-batches per step (pipeline parallelism).
        gradient_clipping (Any): The global gradient-norm clipping value.
        sequence_parallelism (Any): Split the layer-norm and dropout activations along the
            sequence (with tensor parallelism).
        recompute_activations (Any): Recompute the attention activations in the backward
            (selective recomputation).
        use_distributed_optimizer (Any): Shard the optimizer state over the data-parallel
            processes.
        pipeline_model_parallel_split_rank (Any): The rank where an encoder-decoder model's
            pipeline switches to the decoder.
        num_layers_per_virtual_pipeline_stage (Any): Layers per virtual stage (interleaved
            pipeline schedule).
        is_train_batch_min (Any): Take the smallest batch size as the training batch size
            (default True).
        train_iters (Any): The total number of training iterations.
        train_samples (Any): The total number of training samples (instead of `train_iters`).
        weight_decay_incr_style (Any): How the weight decay changes: "constant" (default),
            "linear" or "cosine".
        start_weight_decay (Any): The initial weight decay.
        end_weight_decay (Any): The final weight decay.
        lr_decay_style (Any): How the learning rate decays: "linear" (default), "cosine",
            "constant" ...
        lr_decay_iters (Any): Iterations over which the learning rate decays.
        lr_decay_samples (Any): Samples over which the learning rate decays.
        lr_warmup_iters (Any): Iterations of learning-rate warm-up.
        lr_warmup_samples (Any): Samples of learning-rate warm-up.
        lr_warmup_fraction (Any): The fraction of the decay period spent warming up.
        min_lr (Any): The lowest learning rate of the schedule (default 0).
        consumed_samples (Any): Samples already consumed per dataset (train, valid, test), to
            resume.
        no_wd_decay_cond (Any): Decides which parameters get no weight decay.
        scale_lr_cond (Any): Decides which parameters get a scaled learning rate.
        lr_mult (Any): The factor of that scaled learning rate (default 1.0).
        megatron_dataset_flag (Any): The data is a Megatron-LM dataset (default False).
        seq_length (Any): The maximum sequence length.
        encoder_seq_length (Any): The encoder's maximum sequence length.
        decoder_seq_length (Any): The decoder's maximum sequence length.
        tensorboard_dir (Any): Where Megatron-LM writes TensorBoard logs.
        set_all_logging_options (Any): Turn on all of Megatron-LM's TensorBoard logging (default
            False).
        eval_iters (Any): Iterations per evaluation (default 100).
        eval_interval (Any): Iterations between evaluations (default 1000).
        return_logits (Any): Return the logits from the train step (default False).
        custom_train_step_class (Any): A train-step class used instead of the built-in ones.
        custom_train_step_kwargs (Any): Arguments for that class.
        custom_model_provider_function (Any): A function that builds the model.
        custom_prepare_model_function (Any): A function that prepares the model.
        custom_megatron_datasets_provider_function (Any): A function that builds the Megatron-LM
            datasets.
        custom_get_batch_function (Any): A function that fetches a batch.
        custom_loss_function (Any): A function that computes the loss.
        other_megatron_args (dict[str, Any] | None): Any other Megatron-LM argument, by name.
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
