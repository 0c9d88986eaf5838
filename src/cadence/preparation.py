"""What `Accelerator.prepare` does to each kind of object: models, optimizers, schedulers, dataloaders."""

from __future__ import annotations

import types
import warnings
from typing import Any

import torch

from .bigmodel.training_checks import check_model_is_trainable
from .input_errors import rank_named_errors, with_rank
from .optimizer import AcceleratedOptimizer
from .scheduler import AcceleratedScheduler

_PREPARABLE_KINDS = ("dataloader", "model", "optimizer", "scheduler")


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


def check_preparable(obj: Any, position: int) -> None:
    """Refuse what prepare() would hand back untouched although the user meant it to be prepared.

    Other objects (None, custom objects) still pass through unchanged, as in the reference."""
    where = f"argument {position + 1} of prepare()"
    if isinstance(obj, type) and issubclass(
        obj,
        (
            torch.nn.Module,
            torch.optim.Optimizer,
            torch.optim.lr_scheduler.LRScheduler,
            torch.utils.data.DataLoader,
            torch.utils.data.Dataset,
        ),
    ):
        raise TypeError(
            f"{where} is the class {obj.__name__}, not an object: create it first "
            f"(e.g. {obj.__name__}(...)) and pass the instance."
        )
    if isinstance(obj, torch.utils.data.Dataset):
        raise TypeError(
            f"{where} is a dataset ({type(obj).__name__}); prepare() shards DataLoaders, not datasets. "
            "Pass torch.utils.data.DataLoader(dataset, batch_size=...) instead."
        )
    if isinstance(obj, types.GeneratorType) and obj.gi_code.co_name in (
        "parameters",
        "named_parameters",
    ):
        raise TypeError(
            f"{where} is a generator of parameters (model.{obj.gi_code.co_name}()); pass the model "
            "itself, and build the optimizer from model.parameters()."
        )
    if isinstance(obj, (list, tuple, set, frozenset, dict)):
        items = obj.values() if isinstance(obj, dict) else obj
        inside = sorted({kind_of(item) for item in items} & set(_PREPARABLE_KINDS))
        if inside:
            raise TypeError(
                f"{where} is a {type(obj).__name__} holding {' and '.join(inside)} object(s); prepare() "
                "does not look inside containers. Pass the objects themselves: "
                "model, optimizer = accelerator.prepare(model, optimizer) (or prepare(*objects))."
            )


def _placements(device_placement: Any, count: int) -> list[Any]:
    if device_placement is None:
        return [None] * count
    if not isinstance(device_placement, (list, tuple)) or len(device_placement) != count:
        raise ValueError(
            f"device_placement must be a list with one bool per object passed to prepare() "
            f"({count}), got {device_placement!r}."
        )
    for value in device_placement:
        if value is not None and not isinstance(value, bool):
            raise TypeError(
                f"device_placement entries must be True, False or None, got {value!r} "
                f"(in {device_placement!r})."
            )
    return list(device_placement)


@rank_named_errors
def prepare_all(accelerator: Any, args: tuple[Any, ...], device_placement: Any) -> tuple[Any, ...]:
    """Prepare dataloaders and models first, then optimizers, then schedulers (which wrap optimizers).

    Every argument is checked before any is prepared, so a bad one leaves the others untouched."""
    placements = _placements(device_placement, len(args))
    for position, obj in enumerate(args):
        check_preparable(obj, position)
        if isinstance(obj, torch.nn.Module):  # dispatched models cannot be trained distributed
            check_model_is_trainable(obj, accelerator.distributed_type)
    kinds = [kind_of(obj) for obj in args]
    grouped = accelerator._strategy.prepare_group(list(args), kinds, placements)
    if grouped is not None:  # an engine (DeepSpeed) takes model, optimizer and scheduler together
        return tuple(grouped)
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
    accelerator._strategy.adopt_optimizer(optimizer)  # sharding replaced the model's parameters
    wrapped = AcceleratedOptimizer(
        optimizer, device_placement=device_placement, scaler=accelerator.scaler
    )
    accelerator._optimizers.append(wrapped)
    return wrapped


def check_scheduler(scheduler: Any) -> None:
    """prepare_scheduler() needs something that steps a learning rate: refuse anything else up front."""
    if isinstance(scheduler, (AcceleratedScheduler, torch.optim.lr_scheduler.LRScheduler)):
        return
    if isinstance(scheduler, torch.optim.Optimizer):
        raise TypeError(
            with_rank(
                f"prepare_scheduler() got an optimizer ({type(scheduler).__name__}); pass it to "
                "prepare_optimizer() (or prepare()), and the learning-rate scheduler built on it here."
            )
        )
    if not callable(getattr(scheduler, "step", None)) or not hasattr(scheduler, "optimizer"):
        raise TypeError(
            with_rank(
                "prepare_scheduler() needs a learning-rate scheduler (torch.optim.lr_scheduler.*, "
                f"with .step() and .optimizer), got {type(scheduler).__name__}."
            )
        )


def wrap_scheduler(accelerator: Any, scheduler: Any) -> AcceleratedScheduler:
    check_scheduler(scheduler)
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
