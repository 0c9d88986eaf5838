"""What `Accelerator.prepare` does to each kind of object: models, optimizers, schedulers, dataloaders."""

from __future__ import annotations

import warnings
from typing import Any

import torch

from .optimizer import AcceleratedOptimizer
from .scheduler import AcceleratedScheduler


def _is_scheduler(obj: Any) -> bool:
    return isinstance(obj, torch.optim.lr_scheduler.LRScheduler) or (
        hasattr(obj, "step") and hasattr(obj, "optimizer") and hasattr(obj, "get_last_lr")
    )


def kind_of(obj: Any) -> str:
    if isinstance(obj, torch.utils.data.DataLoader):
        return "dataloader"
    if isinstance(obj, torch.nn.Module):
        return "model"
    if isinstance(obj, torch.optim.Optimizer):
        return "optimizer"
    if _is_scheduler(obj):
        return "scheduler"
    return "other"


def prepare_all(accelerator: Any, args: tuple[Any, ...], device_placement: Any) -> tuple[Any, ...]:
    """Prepare dataloaders and models first, then optimizers, then schedulers (which wrap optimizers)."""
    if device_placement is None:
        placements = [None] * len(args)
    else:
        if not isinstance(device_placement, (list, tuple)) or len(device_placement) != len(args):
            raise ValueError(
                f"device_placement must be a list with one bool per object passed to prepare() "
                f"({len(args)}), got {device_placement!r}."
            )
        placements = list(device_placement)
    kinds = [kind_of(obj) for obj in args]
    result = list(args)
    for order in (("dataloader", "model"), ("optimizer",), ("scheduler",)):
        for index, (obj, kind) in enumerate(zip(args, kinds)):
            if kind in order:
                result[index] = prepare_one(accelerator, obj, kind, placements[index])
    _check_optimizers_match_models(
        accelerator, [r for r, k in zip(result, kinds) if k == "optimizer"]
    )
    return tuple(result)


def prepare_one(accelerator: Any, obj: Any, kind: str, device_placement: bool | None) -> Any:
    if kind == "dataloader":
        return accelerator.prepare_data_loader(obj, device_placement=device_placement)
    if kind == "model":
        return accelerator.prepare_model(obj, device_placement=device_placement)
    if kind == "optimizer":
        return accelerator.prepare_optimizer(obj, device_placement=device_placement)
    if kind == "scheduler":
        return accelerator.prepare_scheduler(obj)
    return obj


def already_prepared_model(accelerator: Any, model: torch.nn.Module) -> Any:
    """The prepared version of `model` if it (or its original module) went through prepare() before."""
    for prepared in accelerator._models:
        if prepared is model or accelerator.unwrap_model(prepared) is model:
            return prepared
    return None


def wrap_optimizer(
    accelerator: Any, optimizer: Any, device_placement: bool
) -> AcceleratedOptimizer:
    if isinstance(optimizer, AcceleratedOptimizer):
        return optimizer
    for prepared in accelerator._optimizers:
        if prepared.optimizer is optimizer:
            return prepared
    wrapped = AcceleratedOptimizer(
        optimizer, device_placement=device_placement, scaler=accelerator.scaler
    )
    accelerator._optimizers.append(wrapped)
    return wrapped


def wrap_scheduler(accelerator: Any, scheduler: Any) -> AcceleratedScheduler:
    if isinstance(scheduler, AcceleratedScheduler):
        return scheduler
    target = getattr(scheduler, "optimizer", None)
    optimizer = next((o for o in accelerator._optimizers if o.optimizer is target), target)
    wrapped = AcceleratedScheduler(
        scheduler,
        optimizer,
        step_with_optimizer=accelerator.step_scheduler_with_optimizer,
        split_batches=accelerator.split_batches,
    )
    accelerator._schedulers.append(wrapped)
    return wrapped


def _check_optimizers_match_models(accelerator: Any, optimizers: list[Any]) -> None:
    if not accelerator._models or not optimizers:
        return
    model_params = {
        id(p) for model in accelerator._models for p in accelerator.unwrap_model(model).parameters()
    }
    for optimizer in optimizers:
        params = [p for group in optimizer.param_groups for p in group["params"]]
        if params and not any(id(p) in model_params for p in params):
            warnings.warn(
                "An optimizer passed to prepare() holds none of the parameters of the prepared models: "
                "it will not train them. Create the optimizer from the same model object you prepare "
                "(e.g. torch.optim.AdamW(model.parameters())) before calling prepare().",
                UserWarning,
                stacklevel=4,
            )
