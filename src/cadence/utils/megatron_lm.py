"""Accelerate's `utils.megatron_lm` path (home: `cadence.unsupported.megatron_lm`; every use raises)."""

from __future__ import annotations

from ..unsupported.megatron_lm import (
    AbstractTrainStep,
    BertTrainStep,
    GPTTrainStep,
    MegatronEngine,
    MegatronLMDummyDataLoader,
    MegatronLMDummyScheduler,
    MegatronLMOptimizerWrapper,
    MegatronLMSchedulerWrapper,
    T5TrainStep,
    avg_losses_across_data_parallel_group,
    finish_mpu_init,
    gather_across_data_parallel_groups,
    initialize,
    model_provider_func,
    prepare_data_loader,
    prepare_model_optimizer_scheduler,
    prepare_optimizer,
    prepare_scheduler,
)

__all__ = [
    "AbstractTrainStep",
    "BertTrainStep",
    "GPTTrainStep",
    "MegatronEngine",
    "MegatronLMDummyDataLoader",
    "MegatronLMDummyScheduler",
    "MegatronLMOptimizerWrapper",
    "MegatronLMSchedulerWrapper",
    "T5TrainStep",
    "avg_losses_across_data_parallel_group",
    "finish_mpu_init",
    "gather_across_data_parallel_groups",
    "initialize",
    "model_provider_func",
    "prepare_data_loader",
    "prepare_model_optimizer_scheduler",
    "prepare_optimizer",
    "prepare_scheduler",
]
