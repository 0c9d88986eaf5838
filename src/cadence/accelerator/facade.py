"""The Accelerator: the public API's table of contents.

Every method is a few lines that delegate to the component that owns the concern, each built once in
`__init__` and given what it needs: the resolved settings (`AcceleratorSettings`), the process state, the
strategy (which owns the precision), the `Preparer`, the `GradientAccumulation`, the `TrackerHub`, and
the `PreparedObjects` record they share. No component receives the Accelerator.
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

import torch

from ..core.enums import FP8BackendType
from ..core.prepared import PreparedObjects
from ..core.profiling import profile
from ..core.settings import describe, read_launch_config
from ..options.dataclasses import (
    DataLoaderConfiguration,
    GradientAccumulationPlugin,
    ProjectConfiguration,
)
from ..plugins.resolve import setup_device_mesh
from ..precision.policy import Precision, remove_forward_wrapper
from ..runtime import collectives as ops
from ..runtime.state import AcceleratorState, GradientState
from ..strategies import StrategyContext, select_strategy
from ..tracking import TrackerHub
from .accumulation import GradientAccumulation
from .checkpoint_methods import CheckpointMethods
from .preparation import Preparer
from .settings import AcceleratorSettings
from .stop_on_notice import arm_stop_on_notice
from .weak_callback import weakly as _weakly

_SPLIT_BATCHES_UNSET = object()


class Accelerator(CheckpointMethods):
    """Creates the distributed set-up (or adopts the one already there) and prepares training objects.

    Example::

        accelerator = Accelerator(mixed_precision="bf16", gradient_accumulation_steps=2)
        model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
        for x, y in loader:
            with accelerator.accumulate(model):
                accelerator.backward(loss_fn(model(x), y))
                optimizer.step()
                optimizer.zero_grad()
    """

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
        self.device_placement = settings.device_placement
        self.dataloader_config = settings.dataloader_config
        self.rng_types = settings.rng_types
        self.step_scheduler_with_optimizer = step_scheduler_with_optimizer
        self.ddp_handler = settings.handlers.get("DistributedDataParallelKwargs")
        self.scaler_handler = settings.handlers.get("GradScalerKwargs")
        self.init_handler = settings.handlers.get("InitProcessGroupKwargs")
        self.autocast_handler = settings.handlers.get("AutocastKwargs")
        self.profile_handler = settings.handlers.get("ProfileKwargs")
        self.fp8_recipe_handler = settings.handlers.get("FP8RecipeKwargs")
        self.ao_recipe_handler = settings.handlers.get("AORecipeKwargs")
        self.te_recipe_handler = settings.handlers.get("TERecipeKwargs")
        self.msamp_recipe_handler = settings.handlers.get("MSAMPRecipeKwargs")
        self.dynamo_plugin = settings.dynamo_plugin
        # Before the process group starts, so a bad log_with fails without side effects.
        self._project_configuration = settings.project_config
        self._tracker_hub = TrackerHub(settings.log_with, _weakly(self, "logging_dir", call=False))

        init_kwargs = self.init_handler.to_kwargs() if self.init_handler is not None else {}
        self.state = AcceleratorState(
            mixed_precision=settings.precision,
            cpu=settings.cpu,
            dynamo_plugin=settings.dynamo_plugin,
            deepspeed_plugin=settings.deepspeed_plugins,
            fsdp_plugin=settings.fsdp_plugin,
            parallelism_config=settings.parallelism_config,
            _from_accelerator=True,
            **init_kwargs,
        )
        if self.state.parallelism_config is not None:
            setup_device_mesh(self.state)
        self.gradient_state = GradientState(
            gradient_accumulation_plugin=settings.accumulation_plugin
        )
        if self.state.debug:  # say where each setting came from, once per process
            print(f"[rank {self.process_index}] Cadence settings:\n{describe(settings.sources)}")
        self.flag_tensor: torch.Tensor | None = None
        self._prepared = PreparedObjects()
        self._strategy = select_strategy(
            StrategyContext.of_state(
                self.state,
                ddp_handler=self.ddp_handler,
                split_batches=self.dataloader_config.split_batches,
                step_scheduler_with_optimizer=self.step_scheduler_with_optimizer,
            ),
            # A later Accelerator of the process trains in the precision the state was created with.
            settings.precision.adopt(self.state.precision_choice),
            self._prepared,
            self.gradient_state,
        )
        # fp8 without a recipe handler: the reference exposes the default recipe it chose.
        backend = getattr(self._strategy.precision, "fp8_backend", None)
        if backend is not None and settings.precision.fp8_handler is None:
            name = {"AO": "ao_recipe_handler", "TE": "te_recipe_handler"}[backend]
            setattr(self, name, self._strategy.precision.recipe_handler)
        self._preparer = Preparer(
            self._strategy,
            self._prepared,
            self.gradient_state,
            device_placement=self.device_placement,
            dataloader_config=self.dataloader_config,
            rng_types=self.rng_types,
            dynamo_plugin=self.dynamo_plugin,
            step_scheduler_with_optimizer=step_scheduler_with_optimizer,
        )
        self._accumulation = GradientAccumulation(
            self._strategy, self._prepared, self.gradient_state
        )
        # The Checkpointer (and checkpoint storage with it) is built on first use: see _checkpointer.
        arm_stop_on_notice(_weakly(self, "save_state"), _weakly(self, "_wait_for_async_save"),
                           settings.project_config, self.process_index, self.num_processes,
                           finish_trackers=self._tracker_hub.end_training)  # fmt: skip

    # -- the state, as attributes -----------------------------------------------------------------
    device = property(lambda self: self.state.device, doc="This process's device.")
    distributed_type = property(lambda self: self.state.distributed_type)
    num_processes = property(lambda self: self.state.num_processes)
    process_index = property(lambda self: self.state.process_index)
    local_process_index = property(lambda self: self.state.local_process_index)
    is_main_process = property(lambda self: self.state.is_main_process)
    is_local_main_process = property(lambda self: self.state.is_local_main_process)
    is_last_process = property(lambda self: self.state.is_last_process)
    use_distributed = property(lambda self: self.state.use_distributed)
    mixed_precision = property(lambda self: self.state.mixed_precision)
    is_fsdp2 = property(lambda self: self.state.is_fsdp2)
    deepspeed_plugin = property(lambda self: self.state.deepspeed_plugin)
    parallelism_config = property(lambda self: self.state.parallelism_config)
    torch_device_mesh = property(lambda self: self.state.device_mesh)
    project_dir = property(lambda self: self.project_configuration.project_dir)
    logging_dir = property(lambda self: self.project_configuration.logging_dir)
    save_iteration = property(lambda self: self.project_configuration.iteration)
    split_batches = property(lambda self: self.dataloader_config.split_batches)
    dispatch_batches = property(lambda self: self.dataloader_config.dispatch_batches)
    use_seedable_sampler = property(lambda self: self.dataloader_config.use_seedable_sampler)
    non_blocking = property(lambda self: self.dataloader_config.non_blocking)
    use_stateful_dataloader = property(lambda self: self.dataloader_config.use_stateful_dataloader)

    @property
    def even_batches(self) -> bool:
        """Whether every process gets as many batches (the last ones completed from the start)."""
        return self.dataloader_config.even_batches

    @even_batches.setter
    def even_batches(self, value: bool) -> None:
        """Set whether batches are made even across processes by reusing samples."""
        self.dataloader_config.even_batches = value

    @property
    def deepspeed_engine_wrapped(self) -> Any:
        """The `DeepSpeedEngineWrapper` that `backward()` drives: the first engine this Accelerator
        prepared (None before that, and without DeepSpeed)."""
        return getattr(self._strategy, "engine_wrapper", None)

    @property
    def fp8_backend(self) -> FP8BackendType:
        """The backend of fp8 training (AO for torchao, TE), or NO when the precision is not fp8."""
        return FP8BackendType(getattr(self._strategy.precision, "fp8_backend", "NO"))

    @property
    def project_configuration(self) -> ProjectConfiguration:
        """Where checkpoints and logs go (may be replaced; the Checkpointer follows)."""
        return self._project_configuration

    @project_configuration.setter
    def project_configuration(self, config: ProjectConfiguration) -> None:
        """Set the project configuration; it must be a `ProjectConfiguration`."""
        if not isinstance(config, ProjectConfiguration):
            raise TypeError(
                f"project_configuration must be a ProjectConfiguration, got {type(config).__name__}."
            )
        self._project_configuration = config
        if "_checkpointer" in self.__dict__:  # already built: it follows
            self._checkpointer.project_config = config

    @property
    def precision(self) -> Precision:
        """The precision policy the strategy owns (autocast, scaler)."""
        return self._strategy.precision

    @property
    def scaler(self) -> Any:
        """The gradient scaler of fp16 training (None otherwise); owned by the precision policy."""
        return self._strategy.precision.scaler

    @property
    def gradient_accumulation_steps(self) -> int:
        """How many micro-batches make one optimizer step."""
        return self.gradient_state.num_steps

    @gradient_accumulation_steps.setter
    def gradient_accumulation_steps(self, steps: int) -> None:
        """Set the number of steps to accumulate gradients over (a positive int)."""
        if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
            raise ValueError(
                f"gradient_accumulation_steps must be a positive integer, got {steps!r}."
            )
        self.gradient_state.plugin_kwargs.update({"num_steps": steps})

    @property
    def sync_gradients(self) -> bool:
        """Whether this micro-step synchronises gradients (and the optimizer steps)."""
        return self.gradient_state.sync_gradients

    @sync_gradients.setter
    def sync_gradients(self, value: bool) -> None:
        """Set whether gradients are synchronized on this step."""
        self.gradient_state.sync_gradients = value

    @property
    def step(self) -> int:
        """The micro-step counter of gradient accumulation."""
        return self._accumulation.step

    @step.setter
    def step(self, value: int) -> None:
        """Set the gradient-accumulation step counter."""
        self._accumulation.step = value

    # The registry's lists, under the reference's attribute names (third-party code reads them).
    _models = property(lambda self: self._prepared.models)
    _optimizers = property(lambda self: self._prepared.optimizers)
    _schedulers = property(lambda self: self._prepared.schedulers)
    _dataloaders = property(lambda self: self._prepared.dataloaders)
    _custom_objects = property(lambda self: self._prepared.custom_objects)
    _save_model_state_pre_hook = property(lambda self: self._prepared.save_state_pre_hooks)
    _load_model_state_pre_hook = property(lambda self: self._prepared.load_state_pre_hooks)

    # -- preparing objects ------------------------------------------------------------------------
    def prepare(self, *args: Any, device_placement: list[bool] | None = None) -> Any:
        """Prepare models, optimizers, schedulers and dataloaders (any order); return them in that order."""
        # The strategy was fixed at construction, but a state reset since then means the user broke this
        # Accelerator: reading the state raises the reference's "`_reset_state()` was called" error.
        self.state.distributed_type  # noqa: B018
        result = self._preparer.prepare(args, device_placement)
        return result[0] if len(result) == 1 else result

    def prepare_model(
        self,
        model: torch.nn.Module,
        device_placement: bool | None = None,
        evaluation_mode: bool = False,
    ) -> torch.nn.Module:
        """Move the model to the device, apply mixed precision, wrap it for distributed training."""
        return self._preparer.model(model, device_placement, evaluation_mode)

    def prepare_optimizer(
        self, optimizer: torch.optim.Optimizer, device_placement: bool | None = None
    ):
        """Wrap the optimizer: it steps only on sync steps, through the fp16 scaler if any."""
        return self._preparer.optimizer(optimizer, device_placement)

    def prepare_scheduler(self, scheduler: Any):
        """Wrap the scheduler so it steps with the optimizer."""
        return self._preparer.scheduler(scheduler)

    def prepare_data_loader(
        self,
        data_loader: Any,
        device_placement: bool | None = None,
        slice_fn_for_dispatch: Any = None,
    ):
        """A loader yielding this process's batches on the device."""
        return self._preparer.data_loader(data_loader, device_placement, slice_fn_for_dispatch)

    def skip_first_batches(self, dataloader: Any, num_batches: int = 0):
        """A dataloader that starts after its first `num_batches` batches."""
        from ..data import (
            skip_first_batches,  # deferred: loaded on first use, keeps `import cadence` cheap
        )

        return skip_first_batches(dataloader, num_batches=num_batches)

    def unwrap_model(
        self,
        model: torch.nn.Module,
        keep_fp32_wrapper: bool = True,
        keep_torch_compile: bool = True,
    ) -> torch.nn.Module:
        """The user's module inside whatever prepare() wrapped it in."""

        inner, compiled = self._strategy.unwrap_fully(model)
        if not keep_fp32_wrapper:
            remove_forward_wrapper(inner)
        if compiled is not None and keep_torch_compile:
            compiled._orig_mod = inner
            return compiled
        return inner

    def get_state_dict(self, model: torch.nn.Module, unwrap: bool = True) -> dict[str, Any]:
        """The model's state dict. Sharded models (FSDP, tensor parallel, ZeRO-3) are gathered whole
        on the main process, on CPU; the other processes may get an empty dict. Collective there."""
        from ..bigmodel.training_checks import (  # deferred: big-model support loads when a state dict is taken
            offloaded_state_dict,
        )

        # A model dispatched with CPU/disk offload: onload its weights module by module.
        offloaded = offloaded_state_dict(self.unwrap_model(model) if unwrap else model)
        return offloaded if offloaded is not None else self._strategy.state_dict(model, unwrap)

    def verify_device_map(self, model: torch.nn.Module) -> bool:
        """Whether `model` was dispatched over devices with a device map (big-model inference)."""
        from ..bigmodel import training_checks  # deferred: big-model support loads when first asked

        return training_checks.verify_device_map(model)

    # -- the training loop ------------------------------------------------------------------------
    def backward(self, loss: torch.Tensor, **kwargs: Any) -> None:
        """Replace `loss.backward()`: scales for accumulation and fp16, then runs the backend's backward."""
        self._accumulation.backward(loss, **kwargs)

    @contextmanager
    def accumulate(self, *models: torch.nn.Module):
        """Accumulate gradients over `gradient_accumulation_steps` micro-batches; sync on the last one."""
        with self._accumulation.accumulate(models):
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
        with self._strategy.precision.autocast(autocast_handler):
            yield

    def unscale_gradients(self, optimizer: Any = None) -> None:
        """Divide fp16 gradients by the loss scale (once per step); a no-op without fp16."""
        self._accumulation.unscale_gradients(optimizer)

    def clip_grad_norm_(
        self, parameters: Any, max_norm: float, norm_type: float = 2
    ) -> torch.Tensor:
        """Unscale, then clip the gradients' total norm; returns the norm before clipping."""
        return self._accumulation.clip_grad_norm_(parameters, max_norm, norm_type)

    def clip_grad_value_(self, parameters: Any, clip_value: float) -> None:
        """Unscale, then clip every gradient value to [-clip_value, clip_value]."""
        self._accumulation.clip_grad_value_(parameters, clip_value)

    @property
    def optimizer_step_was_skipped(self) -> bool:
        """Whether the last optimizer step was skipped (fp16 overflow)."""
        return any(optimizer.step_was_skipped for optimizer in self._prepared.optimizers)

    def gather_for_metrics(self, input_data: Any, use_gather_object: bool = False) -> Any:
        """Gather, then drop the samples duplicated to fill the last batch."""
        from ..data.metrics import (
            gather_for_metrics,  # deferred: loaded on first use, keeps `import cadence` cheap
        )

        return gather_for_metrics(input_data, use_gather_object=use_gather_object)

    @contextmanager
    def join_uneven_inputs(self, joinables: list[Any], even_batches: bool | None = None):
        """Let DDP ranks run different numbers of batches (torch's Join) when even_batches is off."""
        from ..training.join import join_uneven_inputs  # deferred: torch's Join, loaded when used

        with join_uneven_inputs(
            joinables,
            even_batches,
            use_distributed=self.use_distributed,
            dataloaders=self._prepared.dataloaders,
            default_even_batches=self.even_batches,
            distributed_type=self.distributed_type,
        ):
            yield

    @contextmanager
    def maybe_context_parallel(self, buffers=None, buffer_seq_dims=None, no_restore_buffers=None):
        """Shard `buffers` on their sequence dimension and run attention as ring attention over the cp
        ranks (FSDP2 with cp_size > 1); otherwise do nothing, warning once. Re-enter it every step."""
        with self._strategy.maybe_context_parallel(buffers, buffer_seq_dims, no_restore_buffers):
            yield

    def deepspeed_ulysses_dl_adapter(self, dataloader: Any) -> Any:
        """Wrap a dataloader prepared separately for DeepSpeed Ulysses sequence parallelism (each batch
        becomes one sample split over the sequence-parallel group)."""
        ulysses_loader = getattr(self._strategy, "ulysses_loader", None)
        if ulysses_loader is None:
            raise ValueError(
                "deepspeed_ulysses_dl_adapter() needs DeepSpeed with ParallelismConfig(sp_size > 1)."
            )
        return ulysses_loader(dataloader)

    def lomo_backward(self, loss: torch.Tensor, learning_rate: float) -> None:
        """Backward through a LOMO / AdaLomo optimizer (package `lomo-optim`)."""
        self._accumulation.lomo_backward(loss, learning_rate)

    def free_memory(self, *objects: Any) -> tuple[Any, ...]:
        """Drop the references to prepared objects, collect garbage, reset `step`; returns `objects` emptied."""
        import gc

        self._prepared.clear_training_objects()
        self.step = 0
        objects = tuple(None for _ in objects)
        gc.collect()
        if torch.cuda.is_initialized():  # no CUDA context, no cache (and no context created here)
            torch.cuda.empty_cache()
        return objects

    def clear(self, *objects: Any) -> tuple[Any, ...]:
        """Alias of free_memory."""
        return self.free_memory(*objects)

    # -- execution control and collectives (the process state and cadence.runtime.collectives) --------------------
    def wait_for_everyone(self, timeout: float | timedelta | None = None) -> None:
        """Block until every process reaches this point (nothing happens on one process)."""
        self.state.partial_state.wait_for_everyone(timeout)

    @contextmanager
    def main_process_first(self):
        """The main process runs the block first, then the others."""
        with self.state.partial_state.main_process_first():
            yield

    @contextmanager
    def local_main_process_first(self):
        """Each machine's local main process runs the block first, then that machine's others."""
        with self.state.partial_state.local_main_process_first():
            yield

    @contextmanager
    def split_between_processes(self, inputs: Any, apply_padding: bool = False):
        """This process's contiguous share of `inputs` (a list, tuple, dict or tensor)."""
        with self.state.partial_state.split_between_processes(inputs, apply_padding) as part:
            yield part

    def on_main_process(self, function=None):
        """Decorate `function` to run only on the main process."""
        return self.state.partial_state.on_main_process(function)

    def on_local_main_process(self, function=None):
        """Decorate `function` to run only on each machine's local main process."""
        return self.state.partial_state.on_local_main_process(function)

    def on_last_process(self, function=None):
        """Decorate `function` to run only on the last process."""
        return self.state.partial_state.on_last_process(function)

    def on_process(self, function=None, process_index: int | None = None):
        """Decorate `function` to run only on process `process_index`."""
        return self.state.partial_state.on_process(function, process_index=process_index)

    def on_local_process(
        self, function=None, local_process_index: int | None = None, **kwargs: Any
    ):
        """Decorate `function` to run only on local process `local_process_index` of each machine."""
        return self.state.partial_state.on_local_process(
            function, local_process_index=local_process_index, **kwargs
        )

    def print(self, *args: Any, **kwargs: Any) -> None:
        """`print`, once per machine."""
        self.state.partial_state.print(*args, **kwargs)

    def set_trigger(self) -> None:
        """Raise this process's flag; the next `check_trigger` on every process sees it."""
        self.state.partial_state.set_trigger()

    def check_trigger(self) -> bool:
        """True on every process if any process called `set_trigger` (then the flag resets)."""
        return self.state.partial_state.check_trigger()

    def gather(self, tensor: Any) -> Any:
        """Concatenate `tensor` (or nested tensors) from every process along dim 0."""
        return ops.gather(tensor)

    def reduce(self, tensor: Any, reduction: str = "sum", scale: float = 1.0) -> Any:
        """Reduce `tensor` across processes ("sum" or "mean")."""
        return ops.reduce(tensor, reduction, scale)

    def pad_across_processes(
        self, tensor: Any, dim: int = 0, pad_index: Any = 0, pad_first: bool = False
    ) -> Any:
        """Pad `tensor` along `dim` to the largest size any process has, so it can be gathered."""
        return ops.pad_across_processes(tensor, dim=dim, pad_index=pad_index, pad_first=pad_first)

    # -- experiment tracking and profiling (the TrackerHub) ---------------------------------------
    trackers = property(lambda self: self._tracker_hub.trackers, doc="The started trackers.")
    log_with = property(lambda self: self._tracker_hub.log_with, doc="The requested trackers.")

    def init_trackers(
        self, project_name: str, config: dict | None = None, init_kwargs: dict | None = None
    ) -> None:
        """Start a run named `project_name` on every tracker (main process only by default)."""
        self._tracker_hub.init_trackers(project_name, config, init_kwargs)

    def get_tracker(self, name: str, unwrap: bool = False) -> Any:
        """The tracker called `name` (its own run object with `unwrap=True`); a no-op stand-in elsewhere."""
        return self._tracker_hub.get_tracker(name, unwrap)

    def log(self, values: dict, step: int | None = None, log_kwargs: dict | None = None) -> None:
        """Log `values` at `step` to every tracker."""
        self._tracker_hub.log(values, step, log_kwargs)

    def end_training(self) -> None:
        """Finish the trackers, wait for pending checkpoint writes, and destroy the process group."""
        self._tracker_hub.end_training()
        if "_checkpointer" in self.__dict__:  # nothing to wait for when nothing was saved
            self._checkpointer.wait_for_async_save()
        self.state.destroy_process_group()

    @contextmanager
    def profile(self, profile_handler: Any = None):
        """Profile the block with torch.profiler; writes a Chrome trace per rank if output_trace_dir is set."""

        with profile(profile_handler or self.profile_handler, self.state) as profiler:
            yield profiler
