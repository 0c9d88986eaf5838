"""Build the DeepSpeed engine from one prepare() call: fill the config's "auto" values from the
dataloaders, the Accelerator and the model, check the optimizer/scheduler choice, then initialize."""

from __future__ import annotations

import logging
import math
from typing import Any

import torch

from ..plugins.deepspeed import DummyOptim, DummyScheduler
from ..runtime.state import GradientState
from ..training.scheduler import AcceleratedScheduler
from .context import StrategyContext
from .deepspeed_wrappers import (
    DeepSpeedOptimizerWrapper,
    DeepSpeedSchedulerWrapper,
)

logger = logging.getLogger(__name__)

_HIDDEN_SIZE_KEYS = (
    "zero_optimization.reduce_bucket_size",
    "zero_optimization.stage3_prefetch_bucket_size",
    "zero_optimization.stage3_param_persistence_threshold",
)


def _micro_batch_size(context: StrategyContext, plugin: Any, loaders: list[Any]) -> int | None:
    if not plugin.is_auto("train_micro_batch_size_per_gpu"):
        return plugin.get_value("train_micro_batch_size_per_gpu")
    if not loaders:
        raise ValueError(
            "The DeepSpeed config has train_micro_batch_size_per_gpu='auto': pass a dataloader to the same "
            "prepare() call as the model, or set train_micro_batch_size_per_gpu in the DeepSpeed config."
        )
    sizes = [getattr(loader, "batch_size", None) for loader in loaders]
    if any(size is None for size in sizes):
        raise ValueError(
            "A dataloader passed to prepare() has batch_size=None, so train_micro_batch_size_per_gpu='auto' "
            "cannot be filled: set it in the DeepSpeed config."
        )
    if context.split_batches:
        sizes = [size // context.num_processes for size in sizes]
    return min(sizes) if plugin.is_train_batch_min else max(sizes)


def _check_optimizer_and_scheduler(plugin: Any, optimizer: Any, scheduler: Any) -> None:

    config = plugin.deepspeed_config
    if optimizer is not None:
        if "optimizer" in config and not isinstance(optimizer, DummyOptim):
            raise ValueError(
                "The DeepSpeed config defines an optimizer and the code passes one too: remove it from the "
                "config, or pass cadence.utils.DummyOptim(model.parameters()) in the code."
            )
        if "optimizer" not in config and isinstance(optimizer, DummyOptim):
            raise ValueError(
                "DummyOptim stands for the config's optimizer, but the config defines none."
            )
        if isinstance(optimizer, torch.optim.Optimizer):
            config["zero_allow_untested_optimizer"] = True
    if scheduler is not None:
        if "scheduler" in config and not isinstance(scheduler, DummyScheduler):
            raise ValueError(
                "The DeepSpeed config defines a scheduler and the code passes one too: remove it from the "
                "config, or pass cadence.utils.DummyScheduler in the code."
            )
        if (
            "scheduler" not in config
            and isinstance(scheduler, DummyScheduler)
            and scheduler.lr_scheduler_callable is None
        ):
            raise ValueError(
                "DummyScheduler stands for the config's scheduler, but the config defines none: add one, or "
                "pass DummyScheduler(..., lr_scheduler_callable=...)."
            )
        if isinstance(scheduler, DummyScheduler) and not isinstance(optimizer, DummyOptim):
            raise ValueError("DummyScheduler can only be used together with DummyOptim.")


def _config_values(
    context: StrategyContext, plugin: Any, model: Any, optimizer: Any, scheduler: Any, micro: Any
) -> dict:

    values: dict[str, Any] = {
        "gradient_clipping": 1.0,
        "zero_optimization.stage3_gather_16bit_weights_on_model_save": False,
    }
    if micro is not None:
        # The ranks of one sequence-parallel group work on the same samples: they count once.
        config = context.parallelism_config
        sp_size = config.sp_size if config is not None else 1
        values["train_micro_batch_size_per_gpu"] = micro
        values["train_batch_size"] = (
            micro
            * plugin.get_value("gradient_accumulation_steps")
            * context.num_processes
            // sp_size
        )
    auto_keys = [key for key in _HIDDEN_SIZE_KEYS if plugin.is_auto(key)]
    if auto_keys:
        config = getattr(model, "config", None)
        hidden = getattr(config, "hidden_size", None)
        if hidden is None and getattr(config, "hidden_sizes", None):
            hidden = max(config.hidden_sizes)
        if hidden is None:
            raise ValueError(
                f"These DeepSpeed config values are 'auto' but need the model's hidden size, which this model "
                f"does not expose (model.config.hidden_size): {', '.join(auto_keys)}. Set them to numbers."
            )
        values.update(
            {
                "zero_optimization.reduce_bucket_size": hidden * hidden,
                "zero_optimization.stage3_prefetch_bucket_size": int(0.9 * hidden * hidden),
                "zero_optimization.stage3_param_persistence_threshold": 10 * hidden,
            }
        )
    if isinstance(optimizer, DummyOptim):
        values["optimizer.params.lr"] = optimizer.lr
        values["optimizer.params.weight_decay"] = optimizer.weight_decay
    if isinstance(scheduler, DummyScheduler) and scheduler.lr_scheduler_callable is None:
        base = scheduler.optimizer
        max_lr = (
            getattr(base, "lr", None)
            if getattr(base, "defaults", None) is None
            else base.defaults["lr"]
        )
        values["scheduler.params.warmup_min_lr"] = 0
        values["scheduler.params.warmup_max_lr"] = max_lr
        values["scheduler.params.warmup_num_steps"] = max(1, scheduler.warmup_num_steps)
        if scheduler.total_num_steps is not None:
            values["scheduler.params.total_num_steps"] = (
                scheduler.total_num_steps
                if context.split_batches
                else math.ceil(scheduler.total_num_steps / context.num_processes)
            )
    return values


def _engine_optimizer(device: torch.device, config: dict, optimizer: Any) -> Any:
    """The optimizer to hand DeepSpeed. On CPU a torch optimizer is kept as it is, even with optimizer
    offload (it already runs on the CPU; DeepSpeed's CPU Adam would need a compiled op)."""
    offloaded = config["zero_optimization"].get("offload_optimizer", {}).get(
        "device", "none"
    ) not in (
        "none",
        None,
    )
    if not offloaded:
        return optimizer
    if device.type == "cpu":
        config.setdefault("zero_force_ds_cpu_optimizer", False)
        return optimizer
    if not config.get("zero_force_ds_cpu_optimizer", True):
        return optimizer
    from deepspeed.ops.adam import DeepSpeedCPUAdam

    defaults = {k: v for k, v in optimizer.defaults.items() if k in ("lr", "weight_decay")}
    return DeepSpeedCPUAdam(
        optimizer.param_groups, adamw_mode=isinstance(optimizer, torch.optim.AdamW), **defaults
    )


def build_engine(
    deepspeed: Any,
    plugin: Any,
    context: StrategyContext,
    gradient_state: GradientState,
    objects: list[Any],
    kinds: list[str],
    prepare_one: Any,
    sequence_parallel: Any = None,
) -> tuple[list[Any], Any]:
    """Prepare the dataloaders (with `prepare_one`), build the engine; returns (objects, engine).

    `sequence_parallel(model, micro_batch_size)`, when given, sets up Ulysses before the dataloaders
    are prepared (they are split over its groups) and returns the mpu for `deepspeed.initialize`.
    The DeepSpeed config's gradient_accumulation_steps wins over the Accelerator's: `gradient_state`
    (the owner of that number) is updated to it."""

    result = list(objects)
    loaders = [obj for obj, kind in zip(objects, kinds) if kind == "dataloader"]
    micro = _micro_batch_size(context, plugin, loaders)
    model = next(obj for obj, kind in zip(objects, kinds) if kind == "model")
    mpu = sequence_parallel(model, micro or 1) if sequence_parallel is not None else None
    for index, kind in enumerate(kinds):
        if kind == "dataloader":
            result[index] = prepare_one(objects[index], kind, None)
    plugin.fill_match(
        "gradient_accumulation_steps",
        must_match=False,
        gradient_accumulation_steps=gradient_state.num_steps,
    )
    steps = plugin.get_value("gradient_accumulation_steps")
    if steps != gradient_state.num_steps:
        logger.warning(
            "gradient_accumulation_steps: the Accelerator says %s, the DeepSpeed config %s; using DeepSpeed's.",
            gradient_state.num_steps,
            steps,
        )
        gradient_state.plugin_kwargs.update({"num_steps": steps})

    optimizer = next(
        (
            obj
            for obj, kind in zip(objects, kinds)
            if kind == "optimizer" or isinstance(obj, DummyOptim)
        ),
        None,
    )
    scheduler = next(
        (
            obj
            for obj, kind in zip(objects, kinds)
            if kind == "scheduler"
            or isinstance(obj, DummyScheduler)
            or type(obj).__name__ in deepspeed.runtime.lr_schedules.VALID_LR_SCHEDULES
        ),
        None,
    )
    _check_optimizer_and_scheduler(plugin, optimizer, scheduler)
    plugin.set_moe_leaf_modules(model)
    plugin.deepspeed_config_process(
        must_match=False, **_config_values(context, plugin, model, optimizer, scheduler, micro)
    )
    config = plugin.deepspeed_config
    if context.device.type == "cpu" and "optimizer" in config:
        config["optimizer"].setdefault("params", {}).setdefault(
            "torch_adam", True
        )  # no compiled op

    kwargs: dict[str, Any] = {"model": model, "config_params": config}
    if mpu is not None:
        kwargs["mpu"] = mpu
    if optimizer is not None:
        if isinstance(optimizer, DummyOptim):
            kwargs["model_parameters"] = optimizer.params
            if (
                isinstance(scheduler, DummyScheduler)
                and scheduler.lr_scheduler_callable is not None
            ):
                kwargs["lr_scheduler"] = scheduler.lr_scheduler_callable
        else:
            kwargs["optimizer"] = _engine_optimizer(context.device, config, optimizer)
            if (
                scheduler is not None
                and type(scheduler).__name__ in deepspeed.runtime.lr_schedules.VALID_LR_SCHEDULES
            ):
                kwargs["lr_scheduler"] = scheduler
    engine, engine_optimizer, _, engine_scheduler = deepspeed.initialize(**kwargs)

    wrapped_optimizer = (
        DeepSpeedOptimizerWrapper(engine_optimizer) if engine_optimizer is not None else None
    )
    wrapped_scheduler = None
    if scheduler is not None:
        if engine_scheduler is None:
            wrapped_scheduler = _plain_scheduler(context, scheduler, wrapped_optimizer)
        else:
            wrapped_scheduler = DeepSpeedSchedulerWrapper(engine_scheduler, wrapped_optimizer)
    for index, obj in enumerate(objects):
        if obj is model:
            result[index] = engine
        elif obj is optimizer:
            result[index] = wrapped_optimizer
        elif obj is scheduler:
            result[index] = wrapped_scheduler
    return result, engine


def _plain_scheduler(context: StrategyContext, scheduler: Any, optimizer: Any) -> Any:
    """A torch scheduler the user steps; it follows the engine's optimizer."""
    return AcceleratedScheduler(
        scheduler,
        optimizer,
        step_with_optimizer=context.step_scheduler_with_optimizer,
        split_batches=context.split_batches,
    )
