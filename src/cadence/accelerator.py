"""The Accelerator: a façade over the process state, the data, model and optimizer wrappers and the
checkpoint, tracking and launch parts. Each method tells the user-facing story and delegates."""

from __future__ import annotations

import os
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

import torch

from . import ops
from .configs import DataLoaderConfiguration, GradientAccumulationPlugin, ProjectConfiguration
from .enums import DistributedType
from .launch_config import read_launch_config
from .state import AcceleratorState, GradientState

_SPLIT_BATCHES_UNSET = object()


class Accelerator:
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
            _from_accelerator=True,
            **init_kwargs,
        )
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
        self._save_model_state_pre_hook: dict[int, Any] = {}
        self._load_model_state_pre_hook: dict[int, Any] = {}
        self.trackers: list[Any] = []
        self.log_with = settings.log_with
        from .precision import PrecisionPolicy

        self.precision = PrecisionPolicy.create(
            self.state.mixed_precision, self.device, self.scaler_handler, self.autocast_handler,
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
        self.gradient_state.plugin_kwargs.update({"num_steps": steps})

    @property
    def sync_gradients(self) -> bool:
        return self.gradient_state.sync_gradients

    @sync_gradients.setter
    def sync_gradients(self, value: bool) -> None:
        self.gradient_state.sync_gradients = value

    @property
    def is_fsdp2(self) -> bool:
        return False

    # -- execution control ------------------------------------------------------------------------
    def wait_for_everyone(self, timeout: float | timedelta | None = None) -> None:
        """Block until every process reaches this point (nothing happens on one process)."""
        self.state.partial_state.wait_for_everyone(timeout)

    @contextmanager
    def main_process_first(self):
        with self.state.partial_state.main_process_first():
            yield

    @contextmanager
    def local_main_process_first(self):
        with self.state.partial_state.local_main_process_first():
            yield

    @contextmanager
    def split_between_processes(self, inputs: Any, apply_padding: bool = False):
        with self.state.partial_state.split_between_processes(inputs, apply_padding) as part:
            yield part

    def on_main_process(self, function=None):
        return self.state.partial_state.on_main_process(function)

    def on_local_main_process(self, function=None):
        return self.state.partial_state.on_local_main_process(function)

    def on_last_process(self, function=None):
        return self.state.partial_state.on_last_process(function)

    def on_process(self, function=None, process_index: int | None = None):
        return self.state.partial_state.on_process(function, process_index=process_index)

    def on_local_process(
        self, function=None, local_process_index: int | None = None, **kwargs: Any
    ):
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

    # -- collectives --------------------------------------------------------------------------------
    def gather(self, tensor: Any) -> Any:
        return ops.gather(tensor)

    def reduce(self, tensor: Any, reduction: str = "sum", scale: float = 1.0) -> Any:
        return ops.reduce(tensor, reduction, scale)

    def pad_across_processes(
        self, tensor: Any, dim: int = 0, pad_index: Any = 0, pad_first: bool = False
    ) -> Any:
        return ops.pad_across_processes(tensor, dim=dim, pad_index=pad_index, pad_first=pad_first)
