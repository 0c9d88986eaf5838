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
    """Megatron-LM train-step base (unsupported).

    Args:
        name (Any): The train step's name.

    Raises:
        UnsupportedFeatureError: Always (a `NotImplementedError`): Megatron-LM is not supported.
    """

    def __init__(self, name: Any) -> None:
        _fail(type(self).__name__)


class BertTrainStep(AbstractTrainStep):
    """Megatron-LM BERT train step (unsupported).

    Args:
        accelerator (object): The Accelerator.
        args (Any): Megatron-LM's parsed arguments.

    Raises:
        UnsupportedFeatureError: Always (a `NotImplementedError`): Megatron-LM is not supported.
    """

    def __init__(self, accelerator: object, args: Any) -> None:
        _fail(type(self).__name__)


class GPTTrainStep(AbstractTrainStep):
    """Megatron-LM GPT train step (unsupported).

    Args:
        accelerator (object): The Accelerator.
        args (Any): Megatron-LM's parsed arguments.

    Raises:
        UnsupportedFeatureError: Always (a `NotImplementedError`): Megatron-LM is not supported.
    """

    def __init__(self, accelerator: object, args: Any) -> None:
        _fail(type(self).__name__)


class T5TrainStep(AbstractTrainStep):
    """Megatron-LM T5 train step (unsupported).

    Args:
        accelerator (object): The Accelerator.
        args (Any): Megatron-LM's parsed arguments.

    Raises:
        UnsupportedFeatureError: Always (a `NotImplementedError`): Megatron-LM is not supported.
    """

    def __init__(self, accelerator: object, args: Any) -> None:
        _fail(type(self).__name__)


class MegatronEngine:
    """Megatron-LM model engine (unsupported).

    Args:
        accelerator (object): The Accelerator.
        model (Any): The Megatron-LM model.
        optimizer (Any): Its optimizer.
        scheduler (Any): Its scheduler.

    Raises:
        UnsupportedFeatureError: Always (a `NotImplementedError`): Megatron-LM is not supported.
    """

    def __init__(self, accelerator: object, model: Any, optimizer: Any, scheduler: Any) -> None:
        _fail("MegatronEngine")


class MegatronLMDummyDataLoader:
    """Placeholder dataloader for Megatron-LM's own datasets (unsupported).

    Args:
        **dataset_kwargs: Megatron-LM's dataset arguments.

    Raises:
        UnsupportedFeatureError: Always (a `NotImplementedError`): Megatron-LM is not supported.
    """

    def __init__(self, **dataset_kwargs: Any) -> None:
        _fail("MegatronLMDummyDataLoader")


class MegatronLMDummyScheduler:
    """Placeholder scheduler for Megatron-LM (unsupported).

    Args:
        optimizer (Any): The optimizer it schedules.
        total_num_steps (Any): The number of training steps.
        warmup_num_steps (int): The number of warm-up steps (default 0).
        **kwargs: Other scheduler settings.

    Raises:
        UnsupportedFeatureError: Always (a `NotImplementedError`): Megatron-LM is not supported.
    """

    def __init__(
        self, optimizer: Any, total_num_steps: Any = None, warmup_num_steps: int = 0, **kwargs: Any
    ) -> None:
        _fail("MegatronLMDummyScheduler")


class MegatronLMOptimizerWrapper:
    """Megatron-LM optimizer wrapper (unsupported).

    Args:
        optimizer (Any): Megatron-LM's optimizer.

    Raises:
        UnsupportedFeatureError: Always (a `NotImplementedError`): Megatron-LM is not supported.
    """

    def __init__(self, optimizer: Any) -> None:
        _fail("MegatronLMOptimizerWrapper")


class MegatronLMSchedulerWrapper:
    """Megatron-LM scheduler wrapper (unsupported).

    Args:
        scheduler (Any): Megatron-LM's scheduler.
        optimizers (Any): The optimizer(s) it schedules.

    Raises:
        UnsupportedFeatureError: Always (a `NotImplementedError`): Megatron-LM is not supported.
    """

    def __init__(self, scheduler: Any, optimizers: Any) -> None:
        _fail("MegatronLMSchedulerWrapper")


def avg_losses_across_data_parallel_group(losses: Any) -> Any:
    """Average losses over Megatron-LM's data-parallel group (unsupported).

    Args:
        losses (Any): This process's losses.

    Raises:
        UnsupportedFeatureError: Always (a `NotImplementedError`): Megatron-LM is not supported.
    """
    return _fail("avg_losses_across_data_parallel_group")


def finish_mpu_init() -> None:
    """Finish Megatron-LM's model-parallel initialisation (unsupported)."""
    _fail("finish_mpu_init")


def gather_across_data_parallel_groups(tensor: Any) -> Any:
    """Gather over Megatron-LM's data-parallel groups (unsupported).

    Args:
        tensor (Any): The tensor to gather.

    Raises:
        UnsupportedFeatureError: Always (a `NotImplementedError`): Megatron-LM is not supported.
    """
    return _fail("gather_across_data_parallel_groups")


def initialize(
    accelerator: object, extra_args_provider: Any = None, args_defaults: Any = None
) -> None:
    """Initialise Megatron-LM (unsupported).

    Args:
        accelerator (object): The Accelerator.
        extra_args_provider (Any): Adds arguments to Megatron-LM's parser.
        args_defaults (Any): Defaults for Megatron-LM's arguments.

    Raises:
        UnsupportedFeatureError: Always (a `NotImplementedError`): Megatron-LM is not supported.
    """
    _fail("initialize")


def model_provider_func(
    pre_process: bool = True,
    post_process: bool = True,
    add_encoder: bool = True,
    add_decoder: bool = True,
) -> Any:
    """Build a Megatron-LM model (unsupported).

    Args:
        pre_process (bool): Build the embedding stage.
        post_process (bool): Build the output stage.
        add_encoder (bool): Build the encoder.
        add_decoder (bool): Build the decoder.

    Raises:
        UnsupportedFeatureError: Always (a `NotImplementedError`): Megatron-LM is not supported.
    """
    return _fail("model_provider_func")


def prepare_data_loader(accelerator: object, dataloader: Any) -> Any:
    """Prepare a dataloader for Megatron-LM (unsupported).

    Args:
        accelerator (object): The Accelerator.
        dataloader (Any): The dataloader to prepare.

    Raises:
        UnsupportedFeatureError: Always (a `NotImplementedError`): Megatron-LM is not supported.
    """
    return _fail("prepare_data_loader")


def prepare_model_optimizer_scheduler(accelerator: object) -> Any:
    """Build Megatron-LM's model, optimizer and scheduler (unsupported).

    Args:
        accelerator (object): The Accelerator.

    Raises:
        UnsupportedFeatureError: Always (a `NotImplementedError`): Megatron-LM is not supported.
    """
    return _fail("prepare_model_optimizer_scheduler")


def prepare_optimizer(accelerator: object, model: Any) -> Any:
    """Build Megatron-LM's optimizer (unsupported).

    Args:
        accelerator (object): The Accelerator.
        model (Any): The Megatron-LM model.

    Raises:
        UnsupportedFeatureError: Always (a `NotImplementedError`): Megatron-LM is not supported.
    """
    return _fail("prepare_optimizer")


def prepare_scheduler(accelerator: object, optimizer: Any, scheduler: Any) -> Any:
    """Build Megatron-LM's scheduler (unsupported).

    Args:
        accelerator (object): The Accelerator.
        optimizer (Any): The Megatron-LM optimizer.
        scheduler (Any): The scheduler to wrap.

    Raises:
        UnsupportedFeatureError: Always (a `NotImplementedError`): Megatron-LM is not supported.
    """
    return _fail("prepare_scheduler")


def add_model_config_to_megatron_parser(model_type: str) -> Any:
    """Register a Transformers config parser for Megatron-LM (unsupported).

    Args:
        model_type (str): The Transformers model type ("bert", "gpt2" ...).

    Raises:
        UnsupportedFeatureError: Always (a `NotImplementedError`): Megatron-LM is not supported.
    """
    return _fail("add_model_config_to_megatron_parser")


def parse_bert_config(megatron_lm_plugin: Any, model: Any, batch_data: Any) -> None:
    """Copy a BERT config into Megatron-LM arguments (unsupported).

    Args:
        megatron_lm_plugin (Any): The `MegatronLMPlugin` whose arguments are filled.
        model (Any): The Transformers model whose config is read.
        batch_data (Any): A sample batch, for the sequence length.

    Raises:
        UnsupportedFeatureError: Always (a `NotImplementedError`): Megatron-LM is not supported.
    """
    _fail("parse_bert_config")


def parse_gpt2_config(megatron_lm_plugin: Any, model: Any, batch_data: Any) -> None:
    """Copy a GPT-2 config into Megatron-LM arguments (unsupported).

    Args:
        megatron_lm_plugin (Any): The `MegatronLMPlugin` whose arguments are filled.
        model (Any): The Transformers model whose config is read.
        batch_data (Any): A sample batch, for the sequence length.

    Raises:
        UnsupportedFeatureError: Always (a `NotImplementedError`): Megatron-LM is not supported.
    """
    _fail("parse_gpt2_config")


def parse_t5_config(megatron_lm_plugin: Any, model: Any, batch_data: Any) -> None:
    """Copy a T5 config into Megatron-LM arguments (unsupported).

    Args:
        megatron_lm_plugin (Any): The `MegatronLMPlugin` whose arguments are filled.
        model (Any): The Transformers model whose config is read.
        batch_data (Any): A sample batch, for the sequence length.

    Raises:
        UnsupportedFeatureError: Always (a `NotImplementedError`): Megatron-LM is not supported.
    """
    _fail("parse_t5_config")


def parse_llama_config(megatron_lm_plugin: Any, model: Any, batch_data: Any) -> None:
    """Copy a Llama config into Megatron-LM arguments (unsupported).

    Args:
        megatron_lm_plugin (Any): The `MegatronLMPlugin` whose arguments are filled.
        model (Any): The Transformers model whose config is read.
        batch_data (Any): A sample batch, for the sequence length.

    Raises:
        UnsupportedFeatureError: Always (a `NotImplementedError`): Megatron-LM is not supported.
    """
    _fail("parse_llama_config")


def parse_glm4_moe_config(megatron_lm_plugin: Any, model: Any, batch_data: Any) -> None:
    """Copy a GLM-4 MoE config into Megatron-LM arguments (unsupported).

    Args:
        megatron_lm_plugin (Any): The `MegatronLMPlugin` whose arguments are filled.
        model (Any): The Transformers model whose config is read.
        batch_data (Any): A sample batch, for the sequence length.

    Raises:
        UnsupportedFeatureError: Always (a `NotImplementedError`): Megatron-LM is not supported.
    """
    _fail("parse_glm4_moe_config")


# Model type -> config parser, as the reference registers them.
MODEL_CONFIGS_TO_MEGATRON_PARSERS = {
    "megatron-bert": parse_bert_config,
    "gpt2": parse_gpt2_config,
    "t5": parse_t5_config,
    "llama": parse_llama_config,
    "glm4_moe": parse_glm4_moe_config,
}
