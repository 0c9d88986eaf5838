"""The Accelerator's read-only view of its state as attributes (device, ranks, precision, the dataloader
configuration, accumulation settings, the registry's lists). A base class of `Accelerator`, kept apart
so the façade stays one screenful per concern.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from ..core.enums import FP8BackendType
from ..options.dataclasses import ProjectConfiguration

if TYPE_CHECKING:
    from ..options.dataclasses import DataLoaderConfiguration
    from ..precision.policy import Precision
    from ..strategies.deepspeed_wrappers import DeepSpeedEngineWrapper


class StateAttributes:
    """The Accelerator's state as attributes; they read its process state, dataloader configuration,
    project configuration, strategy, gradient state, accumulation and prepared objects."""

    # -- the state, as attributes -----------------------------------------------------------------
    device = property(
        lambda self: self.state.device,
        doc="The `torch.device` this process trains on (`cuda:<local rank>`, `cpu`, `mps`, `xla`).",
    )
    distributed_type = property(
        lambda self: self.state.distributed_type,
        doc="How the processes train together (a `DistributedType`: NO, MULTI_CPU, MULTI_GPU, FSDP, DEEPSPEED, XLA, ...).",
    )
    num_processes = property(
        lambda self: self.state.num_processes,
        doc="How many processes train together (1 when the script runs alone).",
    )
    process_index = property(
        lambda self: self.state.process_index,
        doc="This process's rank among all processes, from 0 to `num_processes - 1`.",
    )
    local_process_index = property(
        lambda self: self.state.local_process_index,
        doc="This process's rank among the processes of its own machine.",
    )
    is_main_process = property(
        lambda self: self.state.is_main_process,
        doc="True on the one process of rank 0 (save, log and print there).",
    )
    is_local_main_process = property(
        lambda self: self.state.is_local_main_process,
        doc="True on the process of local rank 0 of each machine.",
    )
    is_last_process = property(
        lambda self: self.state.is_last_process,
        doc="True on the process of rank `num_processes - 1`.",
    )
    use_distributed = property(
        lambda self: self.state.use_distributed,
        doc="True when more than one process trains (collectives then do real work).",
    )
    mixed_precision = property(
        lambda self: self.state.mixed_precision,
        doc='The mixed precision in use: "no", "fp16", "bf16" or "fp8".',
    )
    is_fsdp2 = property(
        lambda self: self.state.is_fsdp2,
        doc="True when models are sharded with FSDP2 (`fully_shard`).",
    )
    deepspeed_plugin = property(
        lambda self: self.state.deepspeed_plugin,
        doc="The active `DeepSpeedPlugin` (None without DeepSpeed).",
    )
    parallelism_config = property(
        lambda self: self.state.parallelism_config,
        doc="The `ParallelismConfig` in use (None when none was given or configured).",
    )
    torch_device_mesh = property(
        lambda self: self.state.device_mesh,
        doc="The `DeviceMesh` built from the `ParallelismConfig` (None without one).",
    )
    project_dir = property(
        lambda self: self.project_configuration.project_dir,
        doc="The project directory of `project_configuration` (None when not set).",
    )
    logging_dir = property(
        lambda self: self.project_configuration.logging_dir,
        doc="Where trackers write their logs (`project_configuration.logging_dir`).",
    )
    save_iteration = property(
        lambda self: self.project_configuration.iteration,
        doc="The number the next automatically named checkpoint gets (`checkpoint_<n>`).",
    )
    split_batches = property(
        lambda self: self.dataloader_config.split_batches,
        doc="Whether a prepared dataloader's batch is split among processes (from `dataloader_config`).",
    )
    dispatch_batches = property(
        lambda self: self.dataloader_config.dispatch_batches,
        doc="Whether the main process reads batches and sends each process its share (from `dataloader_config`).",
    )
    use_seedable_sampler = property(
        lambda self: self.dataloader_config.use_seedable_sampler,
        doc="Whether prepared dataloaders shuffle with a seedable sampler (from `dataloader_config`).",
    )
    non_blocking = property(
        lambda self: self.dataloader_config.non_blocking,
        doc="Whether batches move to the device with `non_blocking=True` (from `dataloader_config`).",
    )
    use_stateful_dataloader = property(
        lambda self: self.dataloader_config.use_stateful_dataloader,
        doc="Whether prepared dataloaders are torchdata `StatefulDataLoader`s (from `dataloader_config`).",
    )

    @property
    def dataloader_config(self) -> DataLoaderConfiguration:
        """How `prepare()` shards dataloaders. Assigning a new `DataLoaderConfiguration` applies to the
        dataloaders prepared afterwards, as in Accelerate (which reads it at each `prepare`)."""
        return self._dataloader_config

    @dataloader_config.setter
    def dataloader_config(self, value: DataLoaderConfiguration) -> None:
        """Use `value` for the dataloaders prepared from now on."""
        self._dataloader_config = value
        preparer = self.__dict__.get("_preparer")
        if preparer is not None:  # none yet while the Accelerator is being built
            preparer.use_dataloader_config(value)

    @property
    def even_batches(self) -> bool:
        """Whether every process gets the same number of batches from a prepared dataloader.

        When the dataset does not divide evenly, the last batches are completed with samples from the start
        of the dataset (and `gather_for_metrics` drops them again). Assigning it changes the dataloader
        configuration of this Accelerator; `join_uneven_inputs` can turn it off for one block.
        """
        return self.dataloader_config.even_batches

    @even_batches.setter
    def even_batches(self, value: bool) -> None:
        """Set whether prepared dataloaders give every process the same number of batches."""
        self.dataloader_config.even_batches = value

    @property
    def deepspeed_engine_wrapped(self) -> DeepSpeedEngineWrapper | None:
        """The `DeepSpeedEngineWrapper` that `backward()` drives.

        It wraps the first DeepSpeed engine this Accelerator prepared; None before that and without DeepSpeed.
        """
        return getattr(self._strategy, "engine_wrapper", None)

    @property
    def fp8_backend(self) -> FP8BackendType:
        """The FP8 backend in use: `FP8BackendType.AO` (torchao), `TE` (Transformer Engine), or `NO` when not training in fp8."""
        return FP8BackendType(getattr(self._strategy.precision, "fp8_backend", "NO"))

    @property
    def project_configuration(self) -> ProjectConfiguration:
        """The `ProjectConfiguration` in use: where checkpoints and logs go.

        It may be replaced by another `ProjectConfiguration` (assigning anything else raises TypeError);
        checkpoints saved afterwards follow the new one.
        """
        return self._project_configuration

    @project_configuration.setter
    def project_configuration(self, config: ProjectConfiguration) -> None:
        """Replace the project configuration (a `ProjectConfiguration`; anything else raises TypeError)."""
        if not isinstance(config, ProjectConfiguration):
            raise TypeError(
                f"project_configuration must be a ProjectConfiguration, got {type(config).__name__}."
            )
        self._project_configuration = config
        if "_checkpointer" in self.__dict__:  # already built: it follows
            self._checkpointer.project_config = config

    @property
    def precision(self) -> Precision:
        """The precision policy of this Accelerator (what autocast does, the fp16 loss scaler, fp32 outputs)."""
        return self._strategy.precision

    @property
    def scaler(self) -> torch.amp.GradScaler | None:
        """The `torch.amp.GradScaler` of fp16 training, or None in any other precision."""
        return self._strategy.precision.scaler

    @property
    def gradient_accumulation_steps(self) -> int:
        """How many micro-batches make one optimizer step.

        It may be assigned a new positive integer during training; anything else raises ValueError.
        """
        return self.gradient_state.num_steps

    @gradient_accumulation_steps.setter
    def gradient_accumulation_steps(self, steps: int) -> None:
        """Change the number of accumulation steps (a positive integer; anything else raises ValueError)."""
        if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
            raise ValueError(
                f"gradient_accumulation_steps must be a positive integer, got {steps!r}."
            )
        self.gradient_state.plugin_kwargs.update({"num_steps": steps})

    @property
    def sync_gradients(self) -> bool:
        """Whether this micro-step synchronises gradients across processes.

        Inside `accumulate()` it is True on the last micro-batch of each window (and at the end of a
        dataloader); the prepared optimizer steps and the prepared scheduler advances only then. Outside
        `accumulate()` it stays True.
        """
        return self.gradient_state.sync_gradients

    @sync_gradients.setter
    def sync_gradients(self, value: bool) -> None:
        """Force whether the current step synchronises gradients (normally left to `accumulate()`)."""
        self.gradient_state.sync_gradients = value

    @property
    def step(self) -> int:
        """The micro-step counter of gradient accumulation (saved with `save_state` and restored by `load_state`)."""
        return self._accumulation.step

    @step.setter
    def step(self, value: int) -> None:
        """Set the micro-step counter of gradient accumulation."""
        self._accumulation.step = value

    # The registry's lists, under the reference's attribute names (third-party code reads them).
    _models = property(lambda self: self._prepared.models)
    _optimizers = property(lambda self: self._prepared.optimizers)
    _schedulers = property(lambda self: self._prepared.schedulers)
    _dataloaders = property(lambda self: self._prepared.dataloaders)
    _custom_objects = property(lambda self: self._prepared.custom_objects)
    _save_model_state_pre_hook = property(lambda self: self._prepared.save_state_pre_hooks)
    _load_model_state_pre_hook = property(lambda self: self._prepared.load_state_pre_hooks)
