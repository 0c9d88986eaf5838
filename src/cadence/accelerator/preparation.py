"""What `Accelerator.prepare` does to each kind of object: models, optimizers, schedulers, dataloaders.

The `Preparer` receives what it uses (the strategy, the registry of prepared objects, the device and the
dataloader settings) and records every object it prepares in that registry.
"""

from __future__ import annotations

import sys
import types
import warnings
from typing import Any

import torch

from ..core.enums import DynamoBackend
from ..core.input_errors import rank_named_errors, with_rank
from ..core.prepared import PreparedObjects
from ..options.dataclasses import DataLoaderConfiguration
from ..plugins.parallelism import data_parallel_coordinates
from ..runtime.state import GradientState
from ..strategies import Strategy
from ..training.optimizer import AcceleratedOptimizer
from ..training.scheduler import AcceleratedScheduler

_PREPARABLE_KINDS = ("dataloader", "model", "optimizer", "scheduler")


def _is_scheduler(obj: Any) -> bool:
    return isinstance(obj, torch.optim.lr_scheduler.LRScheduler) or (
        hasattr(obj, "step") and hasattr(obj, "optimizer") and hasattr(obj, "get_last_lr")
    )


def kind_of(obj: Any) -> str:
    """ "dataloader", "model", "optimizer", "scheduler" or "other" (passed through untouched)."""
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

    Other objects (None, custom objects) still pass through unchanged, as in Accelerate."""
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


def mark_prepared(obj: Any) -> None:
    """Flag a prepared object the way Accelerate does (`_is_accelerate_prepared = True`): libraries
    built on it (and its own tests) read the flag to avoid preparing an object twice. The same flag
    under Cadence's name, `_is_cadence_prepared`, is what a script switched over by renaming
    `accelerate` to `cadence` reads."""
    try:
        obj._is_accelerate_prepared = True
        obj._is_cadence_prepared = True
    except (AttributeError, TypeError):  # an object that takes no new attributes stays unflagged
        pass


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


class Preparer:
    """Wraps each object for this process's backend and records it in `prepared`."""

    def __init__(
        self,
        strategy: Strategy,
        prepared: PreparedObjects,
        gradient_state: GradientState,
        *,
        device_placement: bool,
        dataloader_config: DataLoaderConfiguration,
        rng_types: list[str],
        dynamo_plugin: Any,
        step_scheduler_with_optimizer: bool,
        fault_tolerance: Any = None,
    ) -> None:
        self.strategy = strategy
        # The replica group's FaultTolerantSession, or None: it receives each prepared object.
        self.fault_tolerance = fault_tolerance
        self.prepared = prepared
        self.gradient_state = gradient_state
        self.device_placement = device_placement
        self.dataloader_config = dataloader_config
        self.rng_types = rng_types
        self.dynamo_plugin = dynamo_plugin
        self.step_scheduler_with_optimizer = step_scheduler_with_optimizer

    def use_dataloader_config(self, config: DataLoaderConfiguration) -> None:
        """Shard the dataloaders prepared from now on as `config` says (the Accelerator's
        `dataloader_config` was replaced)."""
        self.dataloader_config = config

    @property
    def _device(self) -> torch.device:
        return self.strategy.context.device

    @rank_named_errors
    def prepare(self, args: tuple[Any, ...], device_placement: Any) -> tuple[Any, ...]:
        """Prepare dataloaders and models first, then optimizers, then schedulers (which wrap optimizers).

        Every argument is checked before any is prepared, so a bad one leaves the others untouched."""
        from ..bigmodel.training_checks import (  # deferred: big-model checks load at the first prepare
            check_model_is_trainable,
        )

        placements = _placements(device_placement, len(args))
        for position, obj in enumerate(args):
            check_preparable(obj, position)
            if isinstance(obj, torch.nn.Module):  # dispatched models cannot be trained distributed
                check_model_is_trainable(obj, self.strategy.context.distributed_type)
        kinds = [kind_of(obj) for obj in args]
        grouped = self.strategy.prepare_group(list(args), kinds, placements, self.prepare_one)
        if (
            grouped is not None
        ):  # an engine (DeepSpeed) takes model, optimizer and scheduler together
            return tuple(grouped)
        result = list(args)
        for order in (("dataloader", "model"), ("optimizer",), ("scheduler",)):
            for index, (obj, kind) in enumerate(zip(args, kinds)):
                if kind in order:
                    result[index] = self.prepare_one(obj, kind, placements[index])
        self._check_optimizers_match_models([r for r, k in zip(result, kinds) if k == "optimizer"])
        return tuple(result)

    def prepare_one(self, obj: Any, kind: str, device_placement: bool | None) -> Any:
        """Prepare one object of the given kind; other objects come back unchanged."""
        if kind == "dataloader":
            return self.data_loader(obj, device_placement=device_placement)
        if kind == "model":
            return self.model(obj, device_placement=device_placement)
        if kind == "optimizer":
            return self.optimizer(obj, device_placement=device_placement)
        if kind == "scheduler":
            return self.scheduler(obj)
        return obj

    def model(
        self,
        model: torch.nn.Module,
        device_placement: bool | None = None,
        evaluation_mode: bool = False,
    ) -> torch.nn.Module:
        """Move the model to the device, apply mixed precision, compile, wrap it for the backend."""
        if not isinstance(model, torch.nn.Module):
            raise TypeError(
                with_rank(f"prepare_model() needs a torch.nn.Module, got {type(model).__name__}.")
            )
        existing = self._already_prepared(model)
        if existing is not None:
            return existing
        from ..bigmodel.training_checks import (  # deferred: big-model checks load at the first prepare
            check_model_is_trainable,
            check_quantized_model_placement,
            is_quantized_with_device_map,
            verify_device_map,
        )

        # The two probes are read from this package, `cadence.accelerator`, at call time: it is
        # Accelerate's module `accelerate.accelerator`, where scripts and tests patch them.
        package = sys.modules[__package__]
        model = self.strategy.precision.convert_model(model)  # fp8: float8 linears, before wrapping
        check_model_is_trainable(model, self.strategy.context.distributed_type)
        check_quantized_model_placement(
            model,
            self._device,
            self.strategy.context.distributed_type,
            cpu_quantization=package.is_bitsandbytes_multi_backend_available(),
            xpu=package.is_xpu_available(),
        )
        # A model dispatched with a device map (or quantized on its device) stays where it was put.
        placement = self.device_placement if device_placement is None else device_placement
        if placement and not verify_device_map(model) and not is_quantized_with_device_map(model):
            model = self.strategy.place_model(model)
        self.strategy.precision.wrap_forward(model)
        if _compiles(self.dynamo_plugin):
            # Compiled inside the DDP wrapper: dynamo does not trace through DDP's own forward.
            model = torch.compile(model, **self.dynamo_plugin.to_compile_kwargs())
        model = self.strategy.wrap_model(model, evaluation_mode)
        model._is_accelerator_prepared = True  # what integrations check to skip a second prepare
        mark_prepared(model)
        self.prepared.models.append(model)
        if self.fault_tolerance is not None:
            self.fault_tolerance.attach_model(model)
        return model

    def _already_prepared(self, model: torch.nn.Module) -> Any:
        for prepared in self.prepared.models:
            if prepared is model or self.strategy.unwrap_fully(prepared)[0] is model:
                return prepared
        return None

    def optimizer(self, optimizer: Any, device_placement: bool | None = None) -> Any:
        """Wrap the optimizer so it steps only on sync steps and through the precision's scaler."""
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise TypeError(
                with_rank(
                    "prepare_optimizer() needs a torch.optim.Optimizer, got "
                    f"{type(optimizer).__name__}."
                )
            )
        if isinstance(optimizer, AcceleratedOptimizer):
            return optimizer
        existing = self.prepared.find_optimizer(optimizer)
        if existing is not None:
            return existing
        self.strategy.adopt_optimizer(optimizer)  # sharding replaced the model's parameters
        wrapped = AcceleratedOptimizer(
            optimizer,
            device_placement=self.device_placement
            if device_placement is None
            else device_placement,
            scaler=self.strategy.precision.scaler,
            device=self._device,
            gradient_state=self.gradient_state,
        )
        mark_prepared(wrapped)
        if self.fault_tolerance is not None:  # before recording it: a second optimizer is refused
            self.fault_tolerance.attach_optimizer(wrapped)
        self.prepared.optimizers.append(wrapped)
        # fp8 with FSDP2 refreshes its float8 scales after each step.
        self.strategy.precision.attach_optimizer(optimizer, list(self.prepared.models))
        return wrapped

    def scheduler(self, scheduler: Any) -> AcceleratedScheduler:
        """Wrap the scheduler so it follows the optimizer (steps only when the optimizer stepped)."""
        check_scheduler(scheduler)
        if isinstance(scheduler, AcceleratedScheduler):
            return scheduler
        target = getattr(scheduler, "optimizer", None)
        optimizer = self.prepared.find_optimizer(target) or target
        wrapped = AcceleratedScheduler(
            scheduler,
            optimizer,
            step_with_optimizer=self.step_scheduler_with_optimizer,
            split_batches=self.dataloader_config.split_batches,
            # Under fault tolerance a step's samples are those of its participating ranks.
            num_processes=(
                self.fault_tolerance.committed_ranks
                if self.fault_tolerance is not None
                else self.strategy.scheduler_processes
            ),
            gradient_state=self.gradient_state,
        )
        mark_prepared(wrapped)
        self.prepared.schedulers.append(wrapped)
        if self.fault_tolerance is not None:
            self.fault_tolerance.attach_scheduler(wrapped)
        return wrapped

    def data_loader(
        self,
        data_loader: Any,
        device_placement: bool | None = None,
        slice_fn_for_dispatch: Any = None,
    ) -> Any:
        """A loader that yields this process's share of the batches, on the device."""
        context = self.strategy.context
        if self.fault_tolerance is not None:  # the exactly-once cursor replaces the sharding
            placement = self.device_placement if device_placement is None else device_placement

            def group_loader() -> Any:  # an evaluation pass: the DataLoader over this group
                return self._sharded(data_loader, device_placement, slice_fn_for_dispatch)

            loader = self.fault_tolerance.wrap_loader(
                data_loader,
                context.device if placement else None,
                self.gradient_state,
                group_loader=group_loader,
            )
            mark_prepared(loader)
            self.prepared.dataloaders.append(loader)  # its position is saved with the state
            return loader
        prepared = self._sharded(data_loader, device_placement, slice_fn_for_dispatch)
        self.prepared.dataloaders.append(prepared)
        return self.strategy.wrap_data_loader(prepared)

    def _sharded(
        self, data_loader: Any, device_placement: bool | None, slice_fn_for_dispatch: Any
    ) -> Any:
        """`data_loader` prepared over this process's data-parallel peers."""
        from ..data import (
            prepare_data_loader,  # deferred: loaded on first use, keeps `import cadence` cheap
        )

        context = self.strategy.context
        config = self.dataloader_config
        # Ranks of one tensor/context-parallel group read the same batches.
        process_index, num_processes = data_parallel_coordinates(
            context.parallelism_config, context.device, context.process_index, context.num_processes
        )
        prepared = prepare_data_loader(
            data_loader,
            context.device,
            num_processes=num_processes,
            process_index=process_index,
            split_batches=config.split_batches,
            put_on_device=self.device_placement if device_placement is None else device_placement,
            rng_types=list(self.rng_types),
            dispatch_batches=config.dispatch_batches,
            even_batches=config.even_batches,
            slice_fn_for_dispatch=slice_fn_for_dispatch,
            use_seedable_sampler=config.use_seedable_sampler,
            data_seed=config.data_seed,
            non_blocking=config.non_blocking,
            use_stateful_dataloader=config.use_stateful_dataloader,
        )
        prepared.resume_exact_order = config.resume_exact_order  # read when a state is loaded
        mark_prepared(prepared)
        return prepared

    def _check_optimizers_match_models(self, optimizers: list[Any]) -> None:
        if not self.prepared.models or not optimizers:
            return
        model_params = {
            id(p)
            for model in self.prepared.models
            for p in self.strategy.unwrap_fully(model)[0].parameters()
        }
        for optimizer in optimizers:
            params = [p for group in optimizer.param_groups for p in group["params"]]
            if params and not any(id(p) in model_params for p in params):
                warnings.warn(
                    "An optimizer passed to prepare() holds none of the parameters of the prepared "
                    "models: it will not train them. Create the optimizer from the same model object "
                    "you prepare (e.g. torch.optim.AdamW(model.parameters())) before calling prepare().",
                    UserWarning,
                    stacklevel=4,
                )


def _compiles(dynamo_plugin: Any) -> bool:
    # An explicit backend "no" means no compilation whatever the other fields say (transformers'
    # Trainer passes TorchDynamoPlugin(backend=DynamoBackend.NO)), as in the reference.
    return (
        dynamo_plugin is not None
        and not dynamo_plugin.disable
        and dynamo_plugin.backend != DynamoBackend.NO
    )
