"""The Accelerator: a façade over the process state, the data, model and optimizer wrappers and the
checkpoint, tracking and launch parts. Each method tells the user-facing story and delegates."""

from __future__ import annotations

import os
from collections import OrderedDict
from contextlib import contextmanager
from typing import Any

import torch

from . import ops
from .accelerator_checkpoints import CheckpointMethods
from .accelerator_processes import ProcessControlMethods
from .accelerator_tracking import TrackingMethods
from .configs import DataLoaderConfiguration, GradientAccumulationPlugin, ProjectConfiguration
from .enums import DistributedType
from .input_errors import with_rank
from .launch_config import read_launch_config
from .state import AcceleratorState, GradientState

_SPLIT_BATCHES_UNSET = object()


class Accelerator(ProcessControlMethods, TrackingMethods, CheckpointMethods):
    """Creates the distributed set-up (or adopts the one already there) and prepares training objects."""

    def __init__(
        self,
        device_placement: bool = True,
        split_batches: bool = _SPLIT_BATCHES_UNSET,
        mixed_precision: str | None = None,
        gradient_accumulation_steps: int = 1,
        cpu: bool = False,
        dataloader_config: DataLoaderConfiguration | None = None,
        deepspeed_plugin: Any = None,
        fsdp_plugin: Any = None,
        torch_tp_plugin: Any = None,
        megatron_lm_plugin: Any = None,
        rng_types: list[str] | None = None,
        log_with: Any = None,
        project_dir: str | os.PathLike | None = None,
        project_config: ProjectConfiguration | None = None,
        gradient_accumulation_plugin: GradientAccumulationPlugin | None = None,
        step_scheduler_with_optimizer: bool = True,
        kwargs_handlers: list[Any] | None = None,
        dynamo_backend: Any = None,
        dynamo_plugin: Any = None,
        deepspeed_plugins: Any = None,
        parallelism_config: Any = None,
        **unknown: Any,
    ) -> None:
        from .accelerator_setup import AcceleratorSettings

        settings = AcceleratorSettings.resolve(
            device_placement=device_placement,
            split_batches=split_batches,
            split_batches_unset=split_batches is _SPLIT_BATCHES_UNSET,
            mixed_precision=mixed_precision,
            gradient_accumulation_steps=gradient_accumulation_steps,
            cpu=cpu,
            dataloader_config=dataloader_config,
            deepspeed_plugin=deepspeed_plugin,
            deepspeed_plugins=deepspeed_plugins,
            fsdp_plugin=fsdp_plugin,
            torch_tp_plugin=torch_tp_plugin,
            megatron_lm_plugin=megatron_lm_plugin,
            parallelism_config=parallelism_config,
            rng_types=rng_types,
            log_with=log_with,
            project_dir=project_dir,
            project_config=project_config,
            gradient_accumulation_plugin=gradient_accumulation_plugin,
            step_scheduler_with_optimizer=step_scheduler_with_optimizer,
            kwargs_handlers=kwargs_handlers,
            dynamo_backend=dynamo_backend,
            dynamo_plugin=dynamo_plugin,
            unknown=unknown,
            launch=read_launch_config(),
        )
        self._settings = settings
        self.device_placement = settings.device_placement
        self.dataloader_config = settings.dataloader_config
        self.project_configuration = settings.project_config
        from .tracking import TrackerHub

        # Before the process group starts, so a bad log_with fails without side effects.
        self._tracker_hub = TrackerHub(settings.log_with, lambda: self.logging_dir)
        self.rng_types = settings.rng_types
        self.step_scheduler_with_optimizer = step_scheduler_with_optimizer
        self.ddp_handler = settings.handlers.get("DistributedDataParallelKwargs")
        self.scaler_handler = settings.handlers.get("GradScalerKwargs")
        self.init_handler = settings.handlers.get("InitProcessGroupKwargs")
        self.autocast_handler = settings.handlers.get("AutocastKwargs")
        self.profile_handler = settings.handlers.get("ProfileKwargs")
        self.fp8_recipe_handler = settings.handlers.get("FP8RecipeKwargs")
        self.dynamo_plugin = settings.dynamo_plugin

        init_kwargs = self.init_handler.to_kwargs() if self.init_handler is not None else {}
        self.state = AcceleratorState(
            mixed_precision=settings.mixed_precision,
            cpu=settings.cpu,
            dynamo_plugin=settings.dynamo_plugin,
            deepspeed_plugin=settings.deepspeed_plugins,
            fsdp_plugin=settings.fsdp_plugin,
            parallelism_config=settings.parallelism_config,
            _from_accelerator=True,
            **init_kwargs,
        )
        if self.state.parallelism_config is not None:
            from .plugins.resolve import setup_device_mesh

            setup_device_mesh(self)
        self.gradient_state = GradientState(
            gradient_accumulation_plugin=settings.accumulation_plugin
        )
        self.step = 0
        self.flag_tensor: torch.Tensor | None = None
        self._models: list[Any] = []
        self._optimizers: list[Any] = []
        self._schedulers: list[Any] = []
        self._dataloaders: list[Any] = []
        self._custom_objects: list[Any] = []
        self._save_model_state_pre_hook: OrderedDict[int, Any] = OrderedDict()
        self._load_model_state_pre_hook: OrderedDict[int, Any] = OrderedDict()
        from .precision import PrecisionPolicy

        engine_precision = (
            self.distributed_type == DistributedType.DEEPSPEED
        )  # the engine casts itself
        self.precision = PrecisionPolicy.create(
            "no" if engine_precision else self.state.mixed_precision, self.device, self.scaler_handler, self.autocast_handler,
            self.fp8_recipe_handler,
        )  # fmt: skip
        self.scaler = self.precision.scaler

    # -- the state, as attributes -----------------------------------------------------------------
    @property
    def device(self) -> torch.device:
        return self.state.device

    @property
    def distributed_type(self) -> DistributedType:
        return self.state.distributed_type

    @property
    def num_processes(self) -> int:
        return self.state.num_processes

    @property
    def process_index(self) -> int:
        return self.state.process_index

    @property
    def local_process_index(self) -> int:
        return self.state.local_process_index

    @property
    def is_main_process(self) -> bool:
        return self.state.is_main_process

    @property
    def is_local_main_process(self) -> bool:
        return self.state.is_local_main_process

    @property
    def is_last_process(self) -> bool:
        return self.state.is_last_process

    @property
    def use_distributed(self) -> bool:
        return self.state.use_distributed

    @property
    def mixed_precision(self) -> str:
        return self.state.mixed_precision

    @property
    def project_dir(self) -> str | None:
        return self.project_configuration.project_dir

    @property
    def logging_dir(self) -> str | None:
        return self.project_configuration.logging_dir

    @property
    def save_iteration(self) -> int:
        return self.project_configuration.iteration

    @property
    def split_batches(self) -> bool:
        return self.dataloader_config.split_batches

    @property
    def dispatch_batches(self) -> bool | None:
        return self.dataloader_config.dispatch_batches

    @property
    def even_batches(self) -> bool:
        return self.dataloader_config.even_batches

    @even_batches.setter
    def even_batches(self, value: bool) -> None:
        self.dataloader_config.even_batches = value

    @property
    def use_seedable_sampler(self) -> bool:
        return self.dataloader_config.use_seedable_sampler

    @property
    def non_blocking(self) -> bool:
        return self.dataloader_config.non_blocking

    @property
    def use_stateful_dataloader(self) -> bool:
        return self.dataloader_config.use_stateful_dataloader

    @property
    def gradient_accumulation_steps(self) -> int:
        return self.gradient_state.num_steps

    @gradient_accumulation_steps.setter
    def gradient_accumulation_steps(self, steps: int) -> None:
        if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
            raise ValueError(
                f"gradient_accumulation_steps must be a positive integer, got {steps!r}."
            )
        self.gradient_state.plugin_kwargs.update({"num_steps": steps})

    @property
    def sync_gradients(self) -> bool:
        return self.gradient_state.sync_gradients

    @sync_gradients.setter
    def sync_gradients(self, value: bool) -> None:
        self.gradient_state.sync_gradients = value

    @property
    def is_fsdp2(self) -> bool:
        return self.state.is_fsdp2

    @property
    def deepspeed_plugin(self) -> Any:
        return self.state.deepspeed_plugin

    @property
    def parallelism_config(self) -> Any:
        return self.state.parallelism_config

    @property
    def torch_device_mesh(self) -> Any:
        return self.state.device_mesh

    # -- preparing objects ------------------------------------------------------------------------
    @property
    def _strategy(self):
        strategy = self.__dict__.get("_strategy_instance")
        if strategy is None:
            from .strategies import select_strategy

            strategy = self.__dict__["_strategy_instance"] = select_strategy(self)
        return strategy

    def prepare(self, *args: Any, device_placement: list[bool] | None = None) -> Any:
        """Prepare models, optimizers, schedulers and dataloaders (any order); return them in that order."""
        from .preparation import prepare_all

        result = prepare_all(self, args, device_placement)
        return result[0] if len(result) == 1 else result

    def prepare_model(
        self,
        model: torch.nn.Module,
        device_placement: bool | None = None,
        evaluation_mode: bool = False,
    ) -> torch.nn.Module:
        """Move the model to the device, apply mixed precision, wrap it for distributed training."""
        from .preparation import already_prepared_model

        if not isinstance(model, torch.nn.Module):
            raise TypeError(
                with_rank(f"prepare_model() needs a torch.nn.Module, got {type(model).__name__}.")
            )
        existing = already_prepared_model(self, model)
        if existing is not None:
            return existing
        if device_placement is None:
            device_placement = self.device_placement
        from .bigmodel.training_checks import check_model_is_trainable, verify_device_map

        check_model_is_trainable(model, self.distributed_type)
        # a model dispatched with a device map stays where its hooks put it
        if device_placement and not verify_device_map(model):
            model = model.to(self.device)
        self.precision.wrap_forward(model)
        if self.dynamo_plugin is not None and not self.dynamo_plugin.disable:
            # Compiled inside the DDP wrapper: dynamo does not trace through DDP's own forward.
            model = torch.compile(model, **self.dynamo_plugin.to_compile_kwargs())
        model = self._strategy.wrap_model(model, evaluation_mode)
        self._models.append(model)
        return model

    def prepare_optimizer(
        self, optimizer: torch.optim.Optimizer, device_placement: bool | None = None
    ):
        from .preparation import wrap_optimizer

        if not isinstance(optimizer, torch.optim.Optimizer):
            raise TypeError(
                with_rank(
                    f"prepare_optimizer() needs a torch.optim.Optimizer, got {type(optimizer).__name__}."
                )
            )
        return wrap_optimizer(
            self, optimizer, self.device_placement if device_placement is None else device_placement
        )

    def prepare_scheduler(self, scheduler: Any):
        from .preparation import wrap_scheduler

        return wrap_scheduler(self, scheduler)

    def prepare_data_loader(
        self,
        data_loader: Any,
        device_placement: bool | None = None,
        slice_fn_for_dispatch: Any = None,
    ):
        from .data import prepare_data_loader

        if device_placement is None:
            device_placement = self.device_placement
        config = self.dataloader_config
        process_index, num_processes = self.process_index, self.num_processes
        if (
            self.state.parallelism_config is not None
        ):  # TP/CP ranks of one group read the same batches
            from .strategies.mesh import data_parallel_coordinates

            process_index, num_processes = data_parallel_coordinates(self)
        prepared = prepare_data_loader(
            data_loader,
            self.device,
            num_processes=num_processes,
            process_index=process_index,
            split_batches=config.split_batches,
            put_on_device=device_placement,
            rng_types=list(self.rng_types),
            dispatch_batches=config.dispatch_batches,
            even_batches=config.even_batches,
            slice_fn_for_dispatch=slice_fn_for_dispatch,
            use_seedable_sampler=config.use_seedable_sampler,
            data_seed=config.data_seed,
            non_blocking=config.non_blocking,
            use_stateful_dataloader=config.use_stateful_dataloader,
        )
        self._dataloaders.append(prepared)
        return prepared

    def skip_first_batches(self, dataloader: Any, num_batches: int = 0):
        """A dataloader that starts after its first `num_batches` batches."""
        from .data import skip_first_batches

        return skip_first_batches(dataloader, num_batches=num_batches)

    def unwrap_model(
        self,
        model: torch.nn.Module,
        keep_fp32_wrapper: bool = True,
        keep_torch_compile: bool = True,
    ) -> torch.nn.Module:
        """The user's module inside whatever prepare() wrapped it in."""
        from .precision import remove_forward_wrapper

        compiled = None
        inner = model
        while True:
            if hasattr(inner, "_orig_mod"):
                compiled = compiled or inner
                inner = inner._orig_mod
            elif self._strategy.is_wrapped(inner):
                inner = self._strategy.unwrap(inner)
            else:
                break
        if not keep_fp32_wrapper:
            remove_forward_wrapper(inner)
        if compiled is not None and keep_torch_compile:
            compiled._orig_mod = inner
            return compiled
        return inner

    def get_state_dict(self, model: torch.nn.Module, unwrap: bool = True) -> dict[str, Any]:
        """The model's state dict. Sharded models (FSDP, tensor parallel, ZeRO-3) are gathered whole
        on the main process, on CPU; the other processes may get an empty dict. Collective there."""
        from .bigmodel.training_checks import offloaded_state_dict

        # a model dispatched with CPU/disk offload: onload its weights module by module
        offloaded = offloaded_state_dict(self.unwrap_model(model) if unwrap else model)
        return offloaded if offloaded is not None else self._strategy.state_dict(model, unwrap)

    def verify_device_map(self, model: torch.nn.Module) -> bool:
        """Verifies that `model` has not been prepared with big model inference with a device-map resembling `auto`."""
        from .bigmodel.training_checks import verify_device_map

        return verify_device_map(model)

    # -- the training loop ------------------------------------------------------------------------
    def backward(self, loss: torch.Tensor, **kwargs: Any) -> None:
        """Replace `loss.backward()`: scales for accumulation and fp16, then runs the backend's backward."""
        if not isinstance(loss, torch.Tensor):
            raise TypeError(
                with_rank(f"backward() needs the loss tensor, got {type(loss).__name__}.")
            )
        steps = self.gradient_state.num_steps
        strategy = self._strategy
        if steps > 1 and strategy.divides_loss_for_accumulation:
            loss = loss / steps
        if self.scaler is not None:
            loss = self.scaler.scale(loss)
        if self._models and self.gradient_state.sync_gradients and self.state.use_distributed:
            # The wrapped model all-reduces gradients during backward: the watchdog must see it.
            with ops._ledger.entered("backward", None):
                strategy.backward(loss, **kwargs)
        else:
            strategy.backward(loss, **kwargs)
        if not strategy.divides_loss_for_accumulation:
            return
        if self.gradient_state.sync_gradients and 0 < self._window_micro_steps < steps:
            self._reweight_partial_window(steps / self._window_micro_steps)

    def _reweight_partial_window(self, factor: float) -> None:
        # The last window of a dataloader holds fewer than N micro-batches, each divided by N: rescale
        # so the update is the mean gradient of the micro-batches actually accumulated.
        with torch.no_grad():
            for model in self._models:
                for parameter in model.parameters():
                    if parameter.grad is not None:
                        parameter.grad.mul_(factor)

    @property
    def _window_micro_steps(self) -> int:
        return self.__dict__.get("_micro_steps_in_window", 0)

    def _do_sync(self) -> None:
        state = self.gradient_state
        steps = state.num_steps
        if state.sync_with_dataloader and state.end_of_dataloader:
            self._micro_steps_in_window = self.step % steps + 1
            self.step = 0
            state._set_sync_gradients(True)
        else:
            self.step += 1
            sync = self.step % steps == 0
            self._micro_steps_in_window = steps if sync else 0
            state._set_sync_gradients(sync)

    @contextmanager
    def accumulate(self, *models: torch.nn.Module):
        """Accumulate gradients over `gradient_accumulation_steps` micro-batches; sync on the last one."""
        import contextlib

        self._do_sync()
        allow_sync = self.sync_gradients or (
            self.use_distributed and self.gradient_state.sync_each_batch
        )
        with contextlib.ExitStack() as stack:
            if not allow_sync:
                for model in models:
                    stack.enter_context(self._strategy.no_sync(model))
            yield

    @contextmanager
    def no_sync(self, model: torch.nn.Module):
        """Skip the gradient all-reduce of `model` inside the block (no effect on one process)."""
        with self._strategy.no_sync(model):
            yield

    @contextmanager
    def trigger_sync_in_backward(self, model: torch.nn.Module):
        """Make the next backward of `model` synchronise gradients, even after forwards under no_sync."""
        with self._strategy.trigger_sync_in_backward(model):
            yield

    @contextmanager
    def autocast(self, autocast_handler: Any = None):
        """Run the block under this Accelerator's mixed precision (or the given AutocastKwargs)."""
        with self.precision.autocast(autocast_handler):
            yield

    def unscale_gradients(self, optimizer: Any = None) -> None:
        """Divide fp16 gradients by the loss scale (once per step); a no-op without fp16."""
        if self.scaler is None:
            return
        if optimizer is None:
            optimizers = self._optimizers
        else:
            optimizers = optimizer if isinstance(optimizer, (list, tuple)) else [optimizer]
        for opt in optimizers:
            prepared = opt if hasattr(opt, "unscale_") else self._find_prepared_optimizer(opt)
            prepared.unscale_()

    def _find_prepared_optimizer(self, optimizer: Any) -> Any:
        for prepared in self._optimizers:
            if prepared.optimizer is optimizer:
                return prepared
        raise ValueError("unscale_gradients() got an optimizer that was not passed to prepare().")

    def clip_grad_norm_(
        self, parameters: Any, max_norm: float, norm_type: float = 2
    ) -> torch.Tensor:
        """Unscale, then clip the gradients' total norm; returns the norm before clipping."""
        self.unscale_gradients()
        return self._strategy.clip_grad_norm_(parameters, max_norm, norm_type)

    def clip_grad_value_(self, parameters: Any, clip_value: float) -> None:
        """Unscale, then clip every gradient value to [-clip_value, clip_value]."""
        self.unscale_gradients()
        self._strategy.clip_grad_value_(parameters, clip_value)

    @property
    def optimizer_step_was_skipped(self) -> bool:
        """Whether the last optimizer step was skipped (fp16 overflow)."""
        return any(optimizer.step_was_skipped for optimizer in self._optimizers)

    def gather_for_metrics(self, input_data: Any, use_gather_object: bool = False) -> Any:
        """Gather, then drop the samples duplicated to fill the last batch."""
        from .data.metrics import gather_for_metrics

        return gather_for_metrics(input_data, use_gather_object=use_gather_object)

    @contextmanager
    def join_uneven_inputs(self, joinables: list[Any], even_batches: bool | None = None):
        """Let DDP ranks run different numbers of batches (torch's Join) when even_batches is off."""
        from .join import join_uneven_inputs

        with join_uneven_inputs(self, joinables, even_batches):
            yield

    @contextmanager
    def maybe_context_parallel(self, buffers=None, buffer_seq_dims=None, no_restore_buffers=None):
        """Context parallelism needs FSDP2 with cp_size > 1; otherwise this does nothing, as specified."""
        yield

    def lomo_backward(self, loss: torch.Tensor, learning_rate: float) -> None:
        """Backward through a LOMO / AdaLomo optimizer (package `lomo-optim`)."""
        import importlib.util

        if importlib.util.find_spec("lomo_optim") is None:
            raise ImportError("lomo_backward needs the LOMO optimizers: `pip install lomo-optim`.")
        from lomo_optim import AdaLomo, Lomo

        for optimizer in self._optimizers:
            inner = optimizer.optimizer
            if isinstance(inner, (Lomo, AdaLomo)):
                inner.fused_backward(loss, learning_rate)
                return
        raise ValueError("lomo_backward needs a Lomo or AdaLomo optimizer passed to prepare().")

    def free_memory(self, *objects: Any) -> tuple[Any, ...]:
        """Drop the references to prepared objects, collect garbage, reset `step`; returns `objects` emptied."""
        import gc

        self._models.clear()
        self._optimizers.clear()
        self._schedulers.clear()
        self._dataloaders.clear()
        self.step = 0
        objects = tuple(None for _ in objects)
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        return objects

    def clear(self, *objects: Any) -> tuple[Any, ...]:
        """Alias of free_memory."""
        return self.free_memory(*objects)
