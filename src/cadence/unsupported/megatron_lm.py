"""Megatron-LM integration names: present so scripts import; every use raises.

Cadence trains with DDP, FSDP, DeepSpeed and torch tensor parallelism; Megatron-LM's own engine is
not driven.
"""

from __future__ import annotations

from typing import Any

from . import unsupported

FEATURE = "the Megatron-LM integration"
INSTEAD = "Use FSDP (`FullyShardedDataParallelPlugin`) or tensor parallelism (`ParallelismConfig(tp_size=...)`)."


def _fail(name: str) -> Any:
    unsupported(name, FEATURE, INSTEAD)


class AbstractTrainStep:
    """Megatron-LM train-step base (unsupported)."""

    def __init__(self, name: Any) -> None:
        _fail(type(self).__name__)


class BertTrainStep(AbstractTrainStep):
    """Megatron-LM BERT train step (unsupported)."""

    def __init__(self, accelerator: object, args: Any) -> None:
        _fail(type(self).__name__)


class GPTTrainStep(AbstractTrainStep):
    """Megatron-LM GPT train step (unsupported)."""

    def __init__(self, accelerator: object, args: Any) -> None:
        _fail(type(self).__name__)


class T5TrainStep(AbstractTrainStep):
    """Megatron-LM T5 train step (unsupported)."""

    def __init__(self, accelerator: object, args: Any) -> None:
        _fail(type(self).__name__)


class MegatronEngine:
    """Megatron-LM model engine (unsupported)."""

    def __init__(self, accelerator: object, model: Any, optimizer: Any, scheduler: Any) -> None:
        _fail("MegatronEngine")


class MegatronLMDummyDataLoader:
    """Placeholder dataloader for Megatron-LM's own datasets (unsupported)."""

    def __init__(self, **dataset_kwargs: Any) -> None:
        _fail("MegatronLMDummyDataLoader")


class MegatronLMDummyScheduler:
    """Placeholder scheduler for Megatron-LM (unsupported)."""

    def __init__(
        self, optimizer: Any, total_num_steps: Any = None, warmup_num_steps: int = 0, **kwargs: Any
    ) -> None:
        _fail("MegatronLMDummyScheduler")


class MegatronLMOptimizerWrapper:
    """Megatron-LM optimizer wrapper (unsupported)."""

    def __init__(self, optimizer: Any) -> None:
        _fail("MegatronLMOptimizerWrapper")


class MegatronLMSchedulerWrapper:
    """Megatron-LM scheduler wrapper (unsupported)."""

    def __init__(self, scheduler: Any, optimizers: Any) -> None:
        _fail("MegatronLMSchedulerWrapper")


def avg_losses_across_data_parallel_group(losses: Any) -> Any:
    """Average losses over Megatron-LM's data-parallel group (unsupported)."""
    return _fail("avg_losses_across_data_parallel_group")


def finish_mpu_init() -> None:
    """Finish Megatron-LM's model-parallel initialisation (unsupported)."""
    _fail("finish_mpu_init")


def gather_across_data_parallel_groups(tensor: Any) -> Any:
    """Gather over Megatron-LM's data-parallel groups (unsupported)."""
    return _fail("gather_across_data_parallel_groups")


def initialize(
    accelerator: object, extra_args_provider: Any = None, args_defaults: Any = None
) -> None:
    """Initialise Megatron-LM (unsupported)."""
    _fail("initialize")


def model_provider_func(
    pre_process: bool = True,
    post_process: bool = True,
    add_encoder: bool = True,
    add_decoder: bool = True,
) -> Any:
    """Build a Megatron-LM model (unsupported)."""
    return _fail("model_provider_func")


def prepare_data_loader(accelerator: object, dataloader: Any) -> Any:
    """Prepare a dataloader for Megatron-LM (unsupported)."""
    return _fail("prepare_data_loader")


def prepare_model_optimizer_scheduler(accelerator: object) -> Any:
    """Build Megatron-LM's model, optimizer and scheduler (unsupported)."""
    return _fail("prepare_model_optimizer_scheduler")


def prepare_optimizer(accelerator: object, model: Any) -> Any:
    """Build Megatron-LM's optimizer (unsupported)."""
    return _fail("prepare_optimizer")


def prepare_scheduler(accelerator: object, optimizer: Any, scheduler: Any) -> Any:
    """Build Megatron-LM's scheduler (unsupported)."""
    return _fail("prepare_scheduler")


def add_model_config_to_megatron_parser(model_type: str) -> Any:
    """Register a Transformers config parser for Megatron-LM (unsupported)."""
    return _fail("add_model_config_to_megatron_parser")


def parse_bert_config(megatron_lm_plugin: Any, model: Any, batch_data: Any) -> None:
    """Copy a BERT config into Megatron-LM arguments (unsupported)."""
    _fail("parse_bert_config")


def parse_gpt2_config(megatron_lm_plugin: Any, model: Any, batch_data: Any) -> None:
    """Copy a GPT-2 config into Megatron-LM arguments (unsupported)."""
    _fail("parse_gpt2_config")


def parse_t5_config(megatron_lm_plugin: Any, model: Any, batch_data: Any) -> None:
    """Copy a T5 config into Megatron-LM arguments (unsupported)."""
    _fail("parse_t5_config")


def parse_llama_config(megatron_lm_plugin: Any, model: Any, batch_data: Any) -> None:
    """Copy a Llama config into Megatron-LM arguments (unsupported)."""
    _fail("parse_llama_config")


def parse_glm4_moe_config(megatron_lm_plugin: Any, model: Any, batch_data: Any) -> None:
    """Copy a GLM-4 MoE config into Megatron-LM arguments (unsupported)."""
    _fail("parse_glm4_moe_config")


# Model type -> config parser, as the reference registers them.
MODEL_CONFIGS_TO_MEGATRON_PARSERS = {
    "megatron-bert": parse_bert_config,
    "gpt2": parse_gpt2_config,
    "t5": parse_t5_config,
    "llama": parse_llama_config,
    "glm4_moe": parse_glm4_moe_config,
}
