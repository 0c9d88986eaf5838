"""The Accelerator: the public API's table of contents.

Every method is a few lines that delegate to the component that owns the concern, each built once in
`__init__` and given what it needs: the resolved settings (`AcceleratorSettings`), the process state, the
strategy (which owns the precision), the `Preparer`, the `GradientAccumulation`, the `TrackerHub`, and
the `PreparedObjects` record they share. No component receives the Accelerator.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import torch

from ..core.enums import FP8BackendType
from ..core.prepared import PreparedObjects
from ..core.profiling import profile
from ..core.settings import describe, read_launch_config
from ..fault_tolerance.start import start_fault_tolerance
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

if TYPE_CHECKING:  # for the signatures only: importing these would load the backends
    from ..core.enums import DynamoBackend, LoggerType, PrecisionType, RNGType
    from ..options.dataclasses import (
        AutocastKwargs,
        KwargsHandler,
        ProfileKwargs,
        TorchDynamoPlugin,
    )
    from ..plugins.deepspeed import DeepSpeedPlugin
    from ..plugins.fsdp import FullyShardedDataParallelPlugin
    from ..plugins.megatron import MegatronLMPlugin
    from ..plugins.parallelism import ParallelismConfig, TorchTensorParallelPlugin
    from ..strategies.deepspeed_wrappers import DeepSpeedEngineWrapper
    from ..tracking.base import GeneralTracker


class Accelerator(CheckpointMethods):
    """The object a training script talks to: it sets up the processes, prepares the training objects and runs the step.

    Create one near the top of the script. Whatever launched the script (`cadence launch`, `torchrun`,
    SLURM, MPI, a notebook launcher, or nothing at all) decides how many processes there are and which
    device each one gets; the Accelerator reads that, starts the process group if needed, and adapts
    models, optimizers, schedulers and dataloaders so the same script runs unchanged on one CPU, one GPU
    or many machines. Every argument is checked before anything starts, and a wrong one raises an error
    that names the argument and what to pass instead.

    Settings not passed here come from the launcher (`cadence launch` flags or `cadence config` file),
    then the `ACCELERATE_*` environment variables, then the defaults below (see "Where each setting comes
    from" in the concepts).

    Args:
        device_placement (bool): Move prepared models and the batches of prepared dataloaders to
            `accelerator.device` (default True). Set False to place them yourself; `prepare(...,
            device_placement=[...])` overrides it per object. A string is refused with TypeError.
        split_batches (bool | None): Deprecated spelling of `DataLoaderConfiguration(split_batches=...)`.
            None (the default) means "not given": the value of `dataloader_config` applies (False unless
            set there). Given, it warns with a FutureWarning; given together with `dataloader_config`
            it raises ValueError.
        mixed_precision (str | PrecisionType | None): "no", "fp16", "bf16" or "fp8". None takes the
            launcher's `--mixed_precision` or `ACCELERATE_MIXED_PRECISION`, else "no". Another name raises
            ValueError listing the choices; "fp8" needs torchao or Transformer Engine (ImportError
            otherwise) and a GPU of compute capability 8.9 or newer (RuntimeError on CPU); "fp16" and
            "fp8" are refused on XLA devices.
        gradient_accumulation_steps (int): How many micro-batches make one optimizer step (default 1).
            Use it with `accumulate()`. 1 takes `--gradient_accumulation_steps` or
            `ACCELERATE_GRADIENT_ACCUMULATION_STEPS` when set. A value below 1, a bool or a non-integer
            raises ValueError, as does passing it together with `gradient_accumulation_plugin`.
        cpu (bool): Train on the CPU even when a GPU is visible (default False; also
            `ACCELERATE_USE_CPU` or `cadence launch --cpu`). Several CPU processes use gloo.
        dataloader_config (DataLoaderConfiguration | None): How `prepare()` shards dataloaders (batch
            splitting, dispatching, even batches, seedable sampler, non-blocking copies, stateful
            loaders). None means `DataLoaderConfiguration()`. Another type raises TypeError.
        deepspeed_plugin (DeepSpeedPlugin | dict[str, DeepSpeedPlugin] | None): Train with DeepSpeed
            with these settings (a dict names several configurations, switched with
            `state.select_deepspeed_plugin`). Same as `deepspeed_plugins`. None takes
            `cadence launch --use_deepspeed` / `ACCELERATE_USE_DEEPSPEED` settings. Refused on XLA
            devices (ValueError).
        fsdp_plugin (FullyShardedDataParallelPlugin | None): Shard models with FSDP with these
            settings (`fsdp_version=2` for FSDP2, recommended; 1 by default, as in Accelerate). None takes `cadence launch --use_fsdp` /
            `ACCELERATE_USE_FSDP` settings. Combining it with DeepSpeed raises ValueError.
        torch_tp_plugin (TorchTensorParallelPlugin | None): Deprecated in Accelerate: pass
            `parallelism_config=ParallelismConfig(tp_size=...)` instead.
        megatron_lm_plugin (MegatronLMPlugin | None): Megatron-LM training. Cadence does not support
            Megatron-LM yet: any value but None raises NotImplementedError.
        rng_types (list[str | RNGType] | None): The random generators that prepared dataloaders
            synchronise across processes at the start of each epoch: any of "torch", "cuda", "xla",
            "generator". None means `["generator"]` (the sampler's own generator). An unknown name
            raises ValueError; a value that is not a list, a name or an `RNGType` raises TypeError.
        log_with (str | LoggerType | GeneralTracker | list | None): The experiment trackers
            `init_trackers` starts: names such as "tensorboard", "wandb", "mlflow", "comet_ml", "aim",
            "clearml", "dvclive", "swanlab", "trackio", "all" (every installed one), or `GeneralTracker`
            objects of your own. An unknown name, or a tracker whose package is missing, raises before the
            process group starts.
        project_dir (str | os.PathLike | None): The project directory: checkpoints go to
            `<project_dir>/checkpoints` with automatic naming, and trackers log under it. Same as
            `ProjectConfiguration(project_dir=...)`; a different value in `project_config` raises
            ValueError, a non-path TypeError.
        project_config (ProjectConfiguration | None): Where and how checkpoints and logs are written
            (automatic checkpoint names, how many to keep, saving on each machine). None means
            `ProjectConfiguration()`. Another type raises TypeError.
        gradient_accumulation_plugin (GradientAccumulationPlugin | None): Accumulation settings beyond the
            number of steps (syncing at the end of a dataloader, syncing every batch). Passed together with
            `gradient_accumulation_steps` other than 1, raises ValueError.
        step_scheduler_with_optimizer (bool): True (default) when the learning-rate scheduler is stepped
            once per optimizer step: a prepared scheduler then advances once per process so that its
            schedule counts global steps. False for a scheduler stepped on its own rhythm (per epoch).
        kwargs_handlers (list[KwargsHandler] | None): Fine-tuning of the objects Cadence builds:
            `DistributedDataParallelKwargs`, `GradScalerKwargs`, `InitProcessGroupKwargs`,
            `AutocastKwargs`, `ProfileKwargs`, `FP8RecipeKwargs` / `AORecipeKwargs` / `TERecipeKwargs`.
            At most one of each class (ValueError); something that is not a list of handlers raises
            TypeError. An FP8 recipe without `mixed_precision="fp8"` raises ValueError.
        dynamo_backend (DynamoBackend | str | None): Compile prepared models with `torch.compile` and this
            backend ("inductor", "eager", "aot_eager", ...; "no" turns it off). None takes the launcher's
            setting. An unknown backend raises ValueError; passing it with `dynamo_plugin` raises
            ValueError.
        dynamo_plugin (TorchDynamoPlugin | None): `torch.compile` settings beyond the backend (mode,
            fullgraph, dynamic, options).
        deepspeed_plugins (DeepSpeedPlugin | dict[str, DeepSpeedPlugin] | None): Same as
            `deepspeed_plugin`.
        parallelism_config (ParallelismConfig | None): The sizes of the parallel dimensions (data
            parallel replicate/shard, tensor parallel, context parallel); the Accelerator builds the device
            mesh from it. None takes the launcher's settings. Sizes whose product is not the number of
            processes raise ValueError.
        **unknown: Older keyword arguments that Accelerate still accepts: `dispatch_batches`,
            `even_batches`, `use_seedable_sampler` (moved into `DataLoaderConfiguration`, with a
            FutureWarning), `logging_dir` (sets `project_config.logging_dir`) and `kwarg_handler` (an
            alias of `kwargs_handlers`). Any other name raises TypeError naming it.

    Attributes:
        state (AcceleratorState): The process state: ranks, device, precision, plugins.
        gradient_state (GradientState): Whether this micro-step syncs, where the dataloader stands.
        device (torch.device): This process's device.
        distributed_type (DistributedType): How the processes train together (NO, MULTI_CPU,
            MULTI_GPU, FSDP, DEEPSPEED, XLA, ...).
        num_processes (int): How many processes train together.
        process_index (int): This process's rank, from 0 to `num_processes - 1`.
        local_process_index (int): This process's rank on its machine.
        is_main_process (bool): True on rank 0.
        is_local_main_process (bool): True on local rank 0 of each machine.
        is_last_process (bool): True on the last rank.
        use_distributed (bool): True with more than one process.
        mixed_precision (str): "no", "fp16", "bf16" or "fp8".
        is_fsdp2 (bool): True when models are sharded with FSDP2.
        deepspeed_plugin (DeepSpeedPlugin | None): The active DeepSpeed plugin.
        parallelism_config (ParallelismConfig | None): The parallel sizes in use.
        torch_device_mesh (DeviceMesh | None): The mesh built from `parallelism_config`.
        project_dir (str | None): The project folder.
        logging_dir (str | None): Where trackers write.
        save_iteration (int): The number of the next automatically named checkpoint.
        split_batches (bool): From `dataloader_config`.
        dispatch_batches (bool | None): From `dataloader_config`.
        use_seedable_sampler (bool): From `dataloader_config`.
        non_blocking (bool): From `dataloader_config`.
        use_stateful_dataloader (bool): From `dataloader_config`.
        trackers (list[GeneralTracker]): The started trackers.
        log_with (list): The trackers asked for.

    Raises:
        TypeError: An argument of the wrong type (see each argument), or an unknown keyword.
        ValueError: A value out of range or two arguments that contradict each other.
        ImportError: A requested feature needs a package that is not installed (fp8, a tracker,
            DeepSpeed).
        NotImplementedError: `megatron_lm_plugin` was passed.

    Example:
        >>> import torch
        >>> from cadence import Accelerator
        >>> accelerator = Accelerator(gradient_accumulation_steps=2)
        >>> model = torch.nn.Linear(4, 1)
        >>> optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        >>> inputs, targets = torch.randn(16, 4), torch.randn(16, 1)
        >>> data = torch.utils.data.TensorDataset(inputs, targets)
        >>> loader = torch.utils.data.DataLoader(data, batch_size=4)
        >>> model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
        >>> for x, y in loader:
        ...     with accelerator.accumulate(model):
        ...         loss = torch.nn.functional.mse_loss(model(x), y)
        ...         accelerator.backward(loss)
        ...         optimizer.step()
        ...         optimizer.zero_grad()
        >>> accelerator.num_processes
        1
    """

    def __init__(
        self,
        device_placement: bool = True,
        split_batches: bool | None = None,
        mixed_precision: PrecisionType | str | None = None,
        gradient_accumulation_steps: int = 1,
        cpu: bool = False,
        dataloader_config: DataLoaderConfiguration | None = None,
        deepspeed_plugin: DeepSpeedPlugin | dict[str, DeepSpeedPlugin] | None = None,
        fsdp_plugin: FullyShardedDataParallelPlugin | None = None,
        torch_tp_plugin: TorchTensorParallelPlugin | None = None,
        megatron_lm_plugin: MegatronLMPlugin | None = None,
        rng_types: list[str | RNGType] | None = None,
        log_with: str
        | LoggerType
        | GeneralTracker
        | list[str | LoggerType | GeneralTracker]
        | None = None,
        project_dir: str | os.PathLike | None = None,
        project_config: ProjectConfiguration | None = None,
        gradient_accumulation_plugin: GradientAccumulationPlugin | None = None,
        step_scheduler_with_optimizer: bool = True,
        kwargs_handlers: list[KwargsHandler] | None = None,
        dynamo_backend: DynamoBackend | str | None = None,
        dynamo_plugin: TorchDynamoPlugin | None = None,
        deepspeed_plugins: DeepSpeedPlugin | dict[str, DeepSpeedPlugin] | None = None,
        parallelism_config: ParallelismConfig | None = None,
        **unknown: Any,
    ) -> None:
        settings = AcceleratorSettings.resolve(
            device_placement=device_placement,
            split_batches=split_batches,
            split_batches_unset=split_batches is None,
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
        self._fault_tolerance = start_fault_tolerance(
            settings.fault_tolerance,
            device=self.state.device,
            group_rank=self.state.process_index,  # each replica group is its own elastic job
            group_world_size=self.state.num_processes,
            group_barrier=self.state.wait_for_everyone,
        )
        self._preparer = Preparer(
            self._strategy,
            self._prepared,
            self.gradient_state,
            device_placement=self.device_placement,
            dataloader_config=self.dataloader_config,
            rng_types=self.rng_types,
            dynamo_plugin=self.dynamo_plugin,
            step_scheduler_with_optimizer=step_scheduler_with_optimizer,
            fault_tolerance=self._fault_tolerance,
        )
        self._accumulation = GradientAccumulation(
            self._strategy, self._prepared, self.gradient_state
        )
        # The Checkpointer (and checkpoint storage with it) is built on first use: see _checkpointer.
        arm_stop_on_notice(_weakly(self, "save_state"), _weakly(self, "_wait_for_async_save"),
                           settings.project_config, self.process_index, self.num_processes,
                           finish_trackers=self._tracker_hub.end_training)  # fmt: skip

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

    # -- preparing objects ------------------------------------------------------------------------
    def prepare(self, *args: Any, device_placement: list[bool] | None = None) -> Any:
        """Make models, optimizers, schedulers and dataloaders ready for this set-up, and return them.

        Pass the objects in any order; they come back in the same order (a single object comes back alone,
        not in a tuple). Models are moved to the device, given the mixed precision and wrapped for
        distributed training (DDP, FSDP, DeepSpeed, ...); optimizers step only when gradients synchronise;
        schedulers follow their optimizer; each process's dataloader yields its own share of every batch,
        on the device. Other objects (a loss module, a metric) come back unchanged. Preparing an object
        twice returns the prepared one.

        Args:
            *args: The objects to prepare: `torch.nn.Module`, `torch.optim.Optimizer`, learning-rate
                schedulers, `torch.utils.data.DataLoader`, in any order. A class instead of an instance, a
                dataset instead of a dataloader, a generator of parameters, or a list/dict holding these
                objects raises TypeError saying what to pass.
            device_placement (list[bool] | None): One entry per object overriding the Accelerator's
                `device_placement` for it (True, False, or None for the default). A list of another length
                raises ValueError.

        Returns:
            The prepared objects, in the order given; the object itself when only one was passed.

        Raises:
            TypeError: An argument that cannot be prepared (see `*args`).
            ValueError: `device_placement` does not have one entry per object.

        Example:
            >>> import torch
            >>> from cadence import Accelerator
            >>> accelerator = Accelerator()
            >>> model = torch.nn.Linear(4, 1)
            >>> optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
            >>> scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=10)
            >>> loader = torch.utils.data.DataLoader(torch.arange(8.0), batch_size=2)
            >>> model, optimizer, loader, scheduler = accelerator.prepare(
            ...     model, optimizer, loader, scheduler
            ... )
            >>> next(iter(loader)).device.type
            'cpu'
        """
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
        """Prepare one model: move it to the device, apply mixed precision and wrap it for distributed training.

        Args:
            model (torch.nn.Module): The model.
            device_placement (bool | None): Move it to `accelerator.device`; None follows the Accelerator's
                `device_placement`.
            evaluation_mode (bool): Prepare it for inference only: it is placed and given mixed precision
                but not wrapped for gradient synchronisation (default False).

        Returns:
            torch.nn.Module: The prepared model (a wrapper around `model` when distributed).

        Raises:
            TypeError: `model` is not a `torch.nn.Module`.
        """
        return self._preparer.model(model, device_placement, evaluation_mode)

    def prepare_optimizer(
        self, optimizer: torch.optim.Optimizer, device_placement: bool | None = None
    ) -> Any:
        """Prepare one optimizer: it then steps only when gradients synchronise, through the fp16 scaler if any.

        Args:
            optimizer (torch.optim.Optimizer): The optimizer, built on the model's parameters.
            device_placement (bool | None): Move its state to the device; None follows the Accelerator.

        Returns:
            AcceleratedOptimizer: A wrapper that behaves as the optimizer.

        Raises:
            TypeError: `optimizer` is not a `torch.optim.Optimizer`.
        """
        return self._preparer.optimizer(optimizer, device_placement)

    def prepare_scheduler(self, scheduler: torch.optim.lr_scheduler.LRScheduler) -> Any:
        """Prepare one learning-rate scheduler so that it advances with its prepared optimizer.

        Args:
            scheduler (torch.optim.lr_scheduler.LRScheduler): The scheduler, built on an optimizer that is
                (or will be) prepared.

        Returns:
            AcceleratedScheduler: A wrapper that behaves as the scheduler.

        Raises:
            TypeError: `scheduler` is an optimizer, or not a scheduler at all.
        """
        return self._preparer.scheduler(scheduler)

    def prepare_data_loader(
        self,
        data_loader: torch.utils.data.DataLoader,
        device_placement: bool | None = None,
        slice_fn_for_dispatch: Callable | None = None,
    ) -> Any:
        """Prepare one dataloader: each process then reads its own share of every batch, on the device.

        Args:
            data_loader (torch.utils.data.DataLoader): The dataloader, as written for one process.
            device_placement (bool | None): Move batches to `accelerator.device`; None follows the
                Accelerator.
            slice_fn_for_dispatch (Callable | None): With `dispatch_batches=True`, how to cut the main
                process's batch into one piece per process: `fn(batch, slice)`; None slices every tensor
                along its first dimension.

        Returns:
            DataLoaderShard | DataLoaderDispatcher: The prepared dataloader.
        """
        return self._preparer.data_loader(data_loader, device_placement, slice_fn_for_dispatch)

    def skip_first_batches(
        self, dataloader: torch.utils.data.DataLoader, num_batches: int = 0
    ) -> Any:
        """A dataloader that starts after its first `num_batches` batches (to resume in the middle of an epoch).

        Args:
            dataloader (torch.utils.data.DataLoader): A dataloader, prepared or not.
            num_batches (int): How many batches to skip (default 0).

        Returns:
            The same kind of dataloader, starting at batch `num_batches`; iterating it again starts from the
            beginning.

        Example:
            >>> import torch
            >>> from cadence import Accelerator
            >>> accelerator = Accelerator()
            >>> loader = accelerator.prepare(torch.utils.data.DataLoader(torch.arange(6), batch_size=2))
            >>> [batch.tolist() for batch in accelerator.skip_first_batches(loader, num_batches=2)]
            [[4, 5]]
        """
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
        """The model you passed to `prepare()`, without the wrappers it added (DDP, FSDP, DeepSpeed, compile).

        Args:
            model (torch.nn.Module): A prepared model.
            keep_fp32_wrapper (bool): Keep the mixed-precision wrapper of `forward` that returns fp32
                outputs (default True); False restores the original `forward`.
            keep_torch_compile (bool): For a compiled model, return the compiled module around the
                unwrapped one (default True); False returns the plain module.

        Returns:
            torch.nn.Module: The user's module.

        Example:
            >>> import torch
            >>> from cadence import Accelerator
            >>> accelerator = Accelerator()
            >>> model = torch.nn.Linear(2, 2)
            >>> accelerator.unwrap_model(accelerator.prepare(model)) is model
            True
        """

        inner, compiled = self._strategy.unwrap_fully(model)
        if not keep_fp32_wrapper:
            remove_forward_wrapper(inner)
        if compiled is not None and keep_torch_compile:
            compiled._orig_mod = inner
            return compiled
        return inner

    def get_state_dict(self, model: torch.nn.Module, unwrap: bool = True) -> dict[str, Any]:
        """The model's full state dict, ready to save, on any backend.

        Sharded models (FSDP, tensor parallel, DeepSpeed ZeRO-3) are gathered whole on the main process, on
        the CPU; the other processes may get an empty dict. With sharded models every process must call it
        (it is a collective).

        Args:
            model (torch.nn.Module): A prepared model.
            unwrap (bool): Take the state dict of the unwrapped model, so its keys are those of your module
                (default True).

        Returns:
            dict[str, Any]: Parameter and buffer names to tensors.
        """
        from ..bigmodel.training_checks import (  # deferred: big-model support loads when a state dict is taken
            offloaded_state_dict,
        )

        # A model dispatched with CPU/disk offload: onload its weights module by module.
        offloaded = offloaded_state_dict(self.unwrap_model(model) if unwrap else model)
        return offloaded if offloaded is not None else self._strategy.state_dict(model, unwrap)

    def verify_device_map(self, model: torch.nn.Module) -> bool:
        """Whether `model` was dispatched over several devices with a device map (big-model inference).

        Such a model cannot be trained in a distributed set-up; `prepare()` refuses it there.

        Args:
            model (torch.nn.Module): A model.

        Returns:
            bool: True when the model carries a device map that spreads it over more than one device.
        """
        from ..bigmodel import training_checks  # deferred: big-model support loads when first asked

        return training_checks.verify_device_map(model)

    # -- the training loop ------------------------------------------------------------------------
    def backward(self, loss: torch.Tensor, **kwargs: Any) -> None:
        """Compute the gradients of `loss`; use it instead of `loss.backward()`.

        With gradient accumulation the loss is divided by the number of steps; with fp16 it is scaled; with
        DeepSpeed the engine's backward runs. Inside `accumulate()` the gradient all-reduce happens only on
        the micro-step that synchronises.

        Args:
            loss (torch.Tensor): The loss (a scalar tensor).
            **kwargs: Passed to the backend's backward (`retain_graph=True`, `create_graph=True`, ...).

        Raises:
            TypeError: `loss` is not a tensor.

        Example:
            >>> import torch
            >>> from cadence import Accelerator
            >>> accelerator = Accelerator()
            >>> model = accelerator.prepare(torch.nn.Linear(3, 1))
            >>> accelerator.backward(model(torch.ones(2, 3)).sum())
            >>> model.weight.grad.tolist()
            [[2.0, 2.0, 2.0]]
        """
        self._accumulation.backward(loss, **kwargs)

    @contextmanager
    def accumulate(self, *models: torch.nn.Module) -> Iterator[None]:
        """Run one micro-step of gradient accumulation: gradients sync only on the last micro-batch of a window.

        Wrap the forward, backward, optimizer step and zero_grad of each batch in it. It counts
        micro-batches; on all but every `gradient_accumulation_steps`-th one the gradient all-reduce is
        skipped and the prepared optimizer's `step()` and `zero_grad()` do nothing, so the same loop body
        works for any number of accumulation steps. The end of a prepared dataloader always closes the
        window (its last, shorter window is averaged over the micro-batches it holds: see
        "Differences from Accelerate").

        Args:
            *models (torch.nn.Module): The prepared models whose gradient synchronisation to skip on the
                micro-steps that do not sync.

        Example:
            >>> import torch
            >>> from cadence import Accelerator
            >>> accelerator = Accelerator(gradient_accumulation_steps=2)
            >>> model = torch.nn.Linear(2, 1)
            >>> optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
            >>> loader = torch.utils.data.DataLoader(torch.randn(8, 2), batch_size=2)
            >>> model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
            >>> synced = []
            >>> for x in loader:
            ...     with accelerator.accumulate(model):
            ...         accelerator.backward(model(x).pow(2).mean())
            ...         synced.append(accelerator.sync_gradients)
            ...         optimizer.step()
            ...         optimizer.zero_grad()
            >>> synced
            [False, True, False, True]
        """
        with self._accumulation.accumulate(models):
            yield

    @contextmanager
    def no_sync(self, model: torch.nn.Module) -> Iterator[None]:
        """Skip the gradient all-reduce of `model` for the backward passes inside the block.

        Gradients then accumulate locally; the first backward outside the block synchronises them. On one
        process it does nothing. `accumulate()` uses it for you.

        Args:
            model (torch.nn.Module): A prepared model.
        """
        with self._strategy.no_sync(model):
            yield

    @contextmanager
    def trigger_sync_in_backward(self, model: torch.nn.Module) -> Iterator[None]:
        """Make the next backward of `model` synchronise gradients, even inside `no_sync()`.

        Useful when several forward passes run under `no_sync` and the last backward must all-reduce.

        Args:
            model (torch.nn.Module): A prepared model.
        """
        with self._strategy.trigger_sync_in_backward(model):
            yield

    @contextmanager
    def autocast(self, autocast_handler: AutocastKwargs | None = None) -> Iterator[None]:
        """Run the block under this Accelerator's mixed precision, or under the settings of `autocast_handler`.

        Prepared models already run their forward under autocast; use this for computations outside them
        (a loss computed separately), or with `AutocastKwargs(enabled=False)` to compute a block in fp32.

        Args:
            autocast_handler (AutocastKwargs | None): Settings for this block only; None uses the
                Accelerator's.

        Example:
            >>> import torch
            >>> from cadence import Accelerator, AutocastKwargs
            >>> accelerator = Accelerator(mixed_precision="bf16", cpu=True)
            >>> with accelerator.autocast():
            ...     (torch.ones(2, 2) @ torch.ones(2, 2)).dtype
            torch.bfloat16
            >>> with accelerator.autocast(AutocastKwargs(enabled=False)):
            ...     (torch.ones(2, 2) @ torch.ones(2, 2)).dtype
            torch.float32
        """
        with self._strategy.precision.autocast(autocast_handler):
            yield

    def unscale_gradients(self, optimizer: Any = None) -> None:
        """Divide fp16 gradients by the loss scale, once per step; does nothing in other precisions.

        Call it before reading or changing gradients yourself; `clip_grad_norm_` and `clip_grad_value_`
        call it for you.

        Args:
            optimizer (AcceleratedOptimizer | list | None): The prepared optimizer(s) whose gradients to
                unscale; None means all prepared optimizers.

        Raises:
            ValueError: An optimizer that was not passed to `prepare()`.
        """
        self._accumulation.unscale_gradients(optimizer)

    def clip_grad_norm_(
        self,
        parameters: Iterable[torch.Tensor] | torch.Tensor,
        max_norm: float,
        norm_type: float = 2,
    ) -> torch.Tensor:
        """Clip the gradients' total norm to `max_norm`, the way the backend needs it; returns the norm before clipping.

        Unscales fp16 gradients first; with FSDP and DeepSpeed the norm is computed over the sharded
        parameters of every process. Call it only when `sync_gradients` is True (the gradients are
        complete then).

        Args:
            parameters (Iterable[torch.Tensor] | torch.Tensor): The parameters whose gradients to clip,
                usually `model.parameters()`.
            max_norm (float): The largest total norm allowed.
            norm_type (float): The order of the norm (default 2; `float("inf")` for the largest value).

        Returns:
            torch.Tensor: The total norm of the gradients before clipping.

        Example:
            >>> import torch
            >>> from cadence import Accelerator
            >>> accelerator = Accelerator()
            >>> model = accelerator.prepare(torch.nn.Linear(4, 1, bias=False))
            >>> accelerator.backward(model(torch.full((1, 4), 10.0)).sum())
            >>> float(accelerator.clip_grad_norm_(model.parameters(), max_norm=1.0))
            20.0
            >>> round(model.weight.grad.norm().item(), 4)
            1.0
        """
        return self._accumulation.clip_grad_norm_(parameters, max_norm, norm_type)

    def clip_grad_value_(
        self, parameters: Iterable[torch.Tensor] | torch.Tensor, clip_value: float
    ) -> None:
        """Clip every gradient value into `[-clip_value, clip_value]` (after unscaling fp16 gradients).

        Args:
            parameters (Iterable[torch.Tensor] | torch.Tensor): The parameters whose gradients to clip.
            clip_value (float): The largest absolute value allowed.
        """
        self._accumulation.clip_grad_value_(parameters, clip_value)

    @property
    def optimizer_step_was_skipped(self) -> bool:
        """Whether the last optimizer step was skipped because fp16 gradients overflowed.

        When True, a learning-rate scheduler stepped by hand should not advance either.
        """
        return any(optimizer.step_was_skipped for optimizer in self._prepared.optimizers)

    def gather_for_metrics(self, input_data: Any, use_gather_object: bool = False) -> Any:
        """Gather `input_data` from every process, for computing metrics, without the duplicated samples.

        To give every process full batches, a prepared dataloader completes the last batch with samples from
        the start of the dataset. On that last batch this drops them, so metrics count every sample exactly
        once. Tensors are concatenated along their first dimension; other objects are gathered as Python
        objects.

        Args:
            input_data (Any): A tensor, or a list/tuple/dict of tensors, or any picklable objects.
            use_gather_object (bool): Gather as Python objects (lists are concatenated) even when
                `input_data` holds only tensors (default False).

        Returns:
            The gathered data, in process order, with the padding samples removed.

        Example:
            >>> import torch
            >>> from cadence import Accelerator
            >>> accelerator = Accelerator()
            >>> loader = accelerator.prepare(torch.utils.data.DataLoader(torch.arange(5), batch_size=2))
            >>> torch.cat([accelerator.gather_for_metrics(batch) for batch in loader]).tolist()
            [0, 1, 2, 3, 4]
        """
        from ..data.metrics import (
            gather_for_metrics,  # deferred: loaded on first use, keeps `import cadence` cheap
        )

        ft, loader = self._fault_tolerance, self.gradient_state.active_dataloader
        if ft is not None and ft.cuts(loader):  # the step's samples across every replica group
            return ft.gather_for_metrics(input_data, use_gather_object, self.process_index)
        return gather_for_metrics(input_data, use_gather_object=use_gather_object)

    @contextmanager
    def join_uneven_inputs(
        self, joinables: list[Any], even_batches: bool | None = None
    ) -> Iterator[None]:
        """Let processes run different numbers of batches in the block, with torch's `Join` (DDP only).

        Processes that run out of batches early shadow the collectives of the others until all are done.
        With other backends (FSDP, DeepSpeed, ...) it only warns; on one process it does nothing.

        Args:
            joinables (list[torch.distributed.algorithms.Joinable]): The prepared DDP models (and
                `ZeroRedundancyOptimizer`s) taking part.
            even_batches (bool | None): The `even_batches` of the prepared dataloaders inside the block
                (False lets each process read only its own samples, none repeated); None keeps their
                setting.
        """
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
        """Split the sequence dimension of `buffers` across the context-parallel processes for the block.

        Context parallelism is on when the `ParallelismConfig` has `cp_size > 1` with FSDP2 (or
        DDP with `ACCELERATE_ALLOW_CP_STANDALONE=true`): inside the block the buffers hold this
        rank's share of the sequence and attention runs as ring attention over the cp ranks
        (torch's `context_parallel`). Otherwise the block runs unchanged, the buffers are left as
        they are, and a warning says so once. Enter it again every step and call `backward` inside
        it. Shift the labels before the block and pass `position_ids` as a buffer; see the
        "Long sequences" how-to page.

        Args:
            buffers (list[torch.Tensor] | None): The tensors to shard along their sequence dimension (inputs,
                labels, position ids). Buffers that share memory are refused (the split is in place).
            buffer_seq_dims (list[int] | None): The sequence dimension of each buffer, one per buffer.
            no_restore_buffers (set[torch.Tensor] | None): Buffers not restored to their full length when the
                block ends.

        Raises:
            ValueError: With cp on, `position_ids` missing from the buffers, a sequence length not
                divisible by `cp_size`, buffers sharing memory, or an attention mask that is not
                causal (see docs/differences.md).

        Example:
            >>> import torch
            >>> from cadence import Accelerator
            >>> accelerator = Accelerator()
            >>> ids = torch.arange(8).reshape(1, 8)
            >>> with accelerator.maybe_context_parallel(buffers=[ids], buffer_seq_dims=[1]):
            ...     ids.shape  # no context parallelism here: unchanged
            torch.Size([1, 8])
        """
        with self._strategy.maybe_context_parallel(buffers, buffer_seq_dims, no_restore_buffers):
            yield

    def deepspeed_ulysses_dl_adapter(self, dataloader: Any) -> Any:
        """Wrap a dataloader prepared separately for DeepSpeed Ulysses sequence parallelism.

        Dataloaders passed to `prepare` are wrapped already; this is for one prepared on its own.
        Each batch then becomes one sample split over the sequence-parallel group, with
        `shift_labels` added (the batches need `position_ids`).

        Args:
            dataloader (torch.utils.data.DataLoader): The dataloader to wrap.

        Returns:
            The wrapped dataloader (DeepSpeed's `UlyssesSPDataLoaderAdapter` under Cadence's
            end-of-data bookkeeping).

        Raises:
            ValueError: The Accelerator does not run DeepSpeed with `ParallelismConfig(sp_size > 1)`.
        """
        ulysses_loader = getattr(self._strategy, "ulysses_loader", None)
        if ulysses_loader is None:
            raise ValueError(
                "deepspeed_ulysses_dl_adapter() needs DeepSpeed with ParallelismConfig(sp_size > 1)."
            )
        return ulysses_loader(dataloader)

    def lomo_backward(self, loss: torch.Tensor, learning_rate: float) -> None:
        """Backward and update in one pass with a LOMO or AdaLomo optimizer (package `lomo-optim`).

        Args:
            loss (torch.Tensor): The loss.
            learning_rate (float): The learning rate of this update.

        Raises:
            ImportError: `lomo-optim` is not installed.
            ValueError: No Lomo/AdaLomo optimizer was passed to `prepare()`.
        """
        self._accumulation.lomo_backward(loss, learning_rate)

    def free_memory(self, *objects: Any) -> tuple[Any, ...]:
        """Forget every prepared object, collect garbage and empty the CUDA cache; returns `objects` as Nones.

        Use it between trainings in one process (for example when retrying with a smaller batch): drop your
        own references by assigning the result.

        Args:
            *objects: Your references to prepared objects, to be replaced by None.

        Returns:
            tuple: As many `None`s as objects passed.

        Example:
            >>> import torch
            >>> from cadence import Accelerator
            >>> accelerator = Accelerator()
            >>> model = accelerator.prepare(torch.nn.Linear(2, 2))
            >>> model, = accelerator.free_memory(model)
            >>> model is None
            True
        """
        import gc

        self._prepared.clear_training_objects()
        self.step = 0
        objects = tuple(None for _ in objects)
        gc.collect()
        if torch.cuda.is_initialized():  # no CUDA context, no cache (and no context created here)
            torch.cuda.empty_cache()
        return objects

    def clear(self, *objects: Any) -> tuple[Any, ...]:
        """The same as `free_memory`.

        Args:
            *objects: Your references to prepared objects, to be replaced by None.

        Returns:
            tuple: As many `None`s as objects passed.
        """
        return self.free_memory(*objects)

    # -- execution control and collectives (the process state and cadence.runtime.collectives) --------------------
    def wait_for_everyone(self, timeout: float | timedelta | None = None) -> None:
        """Block until every process reaches this call (a barrier); returns at once on one process.

        Args:
            timeout (float | datetime.timedelta | None): Give up after this long (seconds or a timedelta)
                with an error; None waits up to the process group's timeout. A negative or non-numeric
                value raises ValueError, on one process too.

        Example:
            >>> from cadence import Accelerator
            >>> accelerator = Accelerator()
            >>> accelerator.wait_for_everyone()
        """
        self.state.partial_state.wait_for_everyone(timeout)

    @contextmanager
    def main_process_first(self) -> Iterator[None]:
        """Run the block on the main process first, then on all the others together.

        For work the others can reuse once it exists: downloading or preprocessing a dataset into a cache.

        Example:
            >>> from cadence import Accelerator
            >>> accelerator = Accelerator()
            >>> with accelerator.main_process_first():
            ...     data = list(range(4))  # e.g. load_dataset(...), cached by the main process
        """
        with self.state.partial_state.main_process_first():
            yield

    @contextmanager
    def local_main_process_first(self) -> Iterator[None]:
        """Run the block on each machine's local main process first, then on that machine's other processes."""
        with self.state.partial_state.local_main_process_first():
            yield

    @contextmanager
    def split_between_processes(self, inputs: Any, apply_padding: bool = False) -> Iterator[Any]:
        """Give this process its contiguous share of `inputs` inside the block (for distributed inference).

        Args:
            inputs (list | tuple | dict | torch.Tensor): What to split. A dict is split value by value
                (every value must have the same length); a tensor along its first dimension.
            apply_padding (bool): Repeat the last item so that every process gets as many items, which
                `gather` needs (default False: the first processes get one more item).

        Yields:
            This process's share, of the same type as `inputs`.

        Example:
            >>> from cadence import Accelerator
            >>> accelerator = Accelerator()
            >>> with accelerator.split_between_processes(["a", "b", "c"]) as prompts:
            ...     prompts  # on 2 processes: ['a', 'b'] on the first, ['c'] on the second
            ['a', 'b', 'c']
        """
        with self.state.partial_state.split_between_processes(inputs, apply_padding) as part:
            yield part

    def on_main_process(self, function: Callable | None = None) -> Callable:
        """Decorator: run the decorated function only on the main process (it returns None elsewhere).

        Args:
            function (Callable | None): The function to decorate.

        Returns:
            Callable: The decorated function.

        Example:
            >>> from cadence import Accelerator
            >>> accelerator = Accelerator()
            >>> @accelerator.on_main_process
            ... def report():
            ...     print("only once")
            >>> report()
            only once
        """
        return self.state.partial_state.on_main_process(function)

    def on_local_main_process(self, function: Callable | None = None) -> Callable:
        """Decorator: run the decorated function only on each machine's local main process.

        Args:
            function (Callable | None): The function to decorate.

        Returns:
            Callable: The decorated function.
        """
        return self.state.partial_state.on_local_main_process(function)

    def on_last_process(self, function: Callable | None = None) -> Callable:
        """Decorator: run the decorated function only on the last process.

        Args:
            function (Callable | None): The function to decorate.

        Returns:
            Callable: The decorated function.
        """
        return self.state.partial_state.on_last_process(function)

    def on_process(
        self, function: Callable | None = None, process_index: int | None = None
    ) -> Callable:
        """Decorator: run the decorated function only on the process of rank `process_index`.

        Args:
            function (Callable | None): The function to decorate; None returns a decorator (write
                `@accelerator.on_process(process_index=1)`).
            process_index (int | None): The global rank that runs it.

        Returns:
            Callable: The decorated function, or a decorator when `function` is None.
        """
        return self.state.partial_state.on_process(function, process_index=process_index)

    def on_local_process(
        self,
        function: Callable | None = None,
        local_process_index: int | None = None,
        **kwargs: Any,
    ) -> Callable:
        """Decorator: run the decorated function only on local rank `local_process_index` of each machine.

        Args:
            function (Callable | None): The function to decorate; None returns a decorator.
            local_process_index (int | None): The local rank that runs it.
            **kwargs: Accelerate's spelling `local_process_idx=` is accepted for `local_process_index`.

        Returns:
            Callable: The decorated function, or a decorator when `function` is None.
        """
        return self.state.partial_state.on_local_process(
            function, local_process_index=local_process_index, **kwargs
        )

    def print(self, *args: Any, **kwargs: Any) -> None:
        """`print` once per machine (on each local main process), so logs are not repeated by every process.

        Args:
            *args: What to print, as for `print`.
            **kwargs: `print`'s keyword arguments (`sep`, `end`, `file`, `flush`).
        """
        self.state.partial_state.print(*args, **kwargs)

    def set_trigger(self) -> None:
        """Raise this process's flag; the next `check_trigger()` returns True on every process.

        Use it to stop all processes together when one of them decides to (early stopping, a NaN loss)
        without a collective on every step.
        """
        self.state.partial_state.set_trigger()

    def check_trigger(self) -> bool:
        """Whether any process called `set_trigger()` since the last check; the flag is then cleared.

        Every process must call it at the same point (it is a collective).

        Returns:
            bool: The same answer on every process.

        Example:
            >>> from cadence import Accelerator
            >>> accelerator = Accelerator()
            >>> accelerator.set_trigger()
            >>> accelerator.check_trigger(), accelerator.check_trigger()
            (True, False)
        """
        return self.state.partial_state.check_trigger()

    def gather(self, tensor: Any) -> Any:
        """Concatenate `tensor` from every process along its first dimension, on every process.

        Every process must pass tensors of the same shape (use `pad_across_processes` first otherwise).
        For evaluation use `gather_for_metrics`, which also drops the padding samples of the last batch.

        Args:
            tensor (torch.Tensor | list | tuple | dict): A tensor or a nested structure of tensors.

        Returns:
            The same structure with each tensor gathered (`num_processes` times longer).

        Example:
            >>> import torch
            >>> from cadence import Accelerator
            >>> accelerator = Accelerator()
            >>> accelerator.gather(torch.tensor([accelerator.process_index])).tolist()
            [0]
        """
        return ops.gather(tensor)

    def reduce(self, tensor: Any, reduction: str = "sum", scale: float = 1.0) -> Any:
        """Reduce `tensor` across processes, so every process holds the result.

        Args:
            tensor (torch.Tensor | list | tuple | dict): A tensor or a nested structure of tensors.
            reduction (str): "sum" (default), "mean" or "none".
            scale (float): Multiply the result by this factor (default 1.0).

        Returns:
            The reduced data, of the same structure.
        """
        return ops.reduce(tensor, reduction, scale)

    def pad_across_processes(
        self, tensor: Any, dim: int = 0, pad_index: Any = 0, pad_first: bool = False
    ) -> Any:
        """Pad `tensor` along `dim` to the largest size any process has, so that it can be gathered.

        Args:
            tensor (torch.Tensor | list | tuple | dict): A tensor or a nested structure of tensors.
            dim (int): The dimension to pad (default 0).
            pad_index (int | float): The value of the padding (default 0).
            pad_first (bool): Pad at the start instead of the end (default False).

        Returns:
            The padded data, of the same structure.
        """
        return ops.pad_across_processes(tensor, dim=dim, pad_index=pad_index, pad_first=pad_first)

    # -- experiment tracking and profiling (the TrackerHub) ---------------------------------------
    trackers = property(
        lambda self: self._tracker_hub.trackers,
        doc="The started trackers (`GeneralTracker` objects); empty before `init_trackers`.",
    )
    log_with = property(
        lambda self: self._tracker_hub.log_with,
        doc="The trackers that were asked for with `log_with`, as given.",
    )

    def init_trackers(
        self, project_name: str, config: dict | None = None, init_kwargs: dict | None = None
    ) -> None:
        """Start a run named `project_name` on every tracker of `log_with` (on the main process).

        Args:
            project_name (str): The run's (or project's) name.
            config (dict | None): Hyperparameters to record with the run.
            init_kwargs (dict | None): Per-tracker keyword arguments for its start function, keyed by
                tracker name: `{"wandb": {"entity": "me"}}`.

        Example:
            >>> from cadence import Accelerator
            >>> accelerator = Accelerator(log_with="tensorboard", project_dir="runs")
            >>> accelerator.init_trackers("demo", config={"lr": 0.1})
            >>> accelerator.log({"loss": 0.5}, step=1)
            >>> accelerator.end_training()
        """
        self._tracker_hub.init_trackers(project_name, config, init_kwargs)

    def get_tracker(self, name: str, unwrap: bool = False) -> Any:
        """The started tracker called `name`.

        Args:
            name (str): The tracker's name, as in `log_with` ("wandb", "tensorboard", ...).
            unwrap (bool): Return the tracker's own run object (a `wandb.Run`, a `SummaryWriter`, ...)
                instead of Cadence's `GeneralTracker` (default False).

        Returns:
            The tracker; on processes that do not log, a stand-in whose methods do nothing.
        """
        return self._tracker_hub.get_tracker(name, unwrap)

    def log(self, values: dict, step: int | None = None, log_kwargs: dict | None = None) -> None:
        """Log `values` to every started tracker (on the processes that log: the main one by default).

        Args:
            values (dict): Names to values (numbers, strings, or what the tracker accepts).
            step (int | None): The step to log them at.
            log_kwargs (dict | None): Per-tracker keyword arguments for its log call, keyed by tracker name.
        """
        self._tracker_hub.log(values, step, log_kwargs)

    def end_training(self) -> None:
        """Finish: close the trackers, wait for a pending asynchronous checkpoint, end the process group.

        Call it at the end of a script that used trackers or `save_state(async_save=True)`.
        """
        self._tracker_hub.end_training()
        if self._fault_tolerance is not None:
            self._fault_tolerance.shutdown()
        if "_checkpointer" in self.__dict__:  # nothing to wait for when nothing was saved
            self._checkpointer.wait_for_async_save()
        self.state.destroy_process_group()

    @contextmanager
    def profile(self, profile_handler: ProfileKwargs | None = None) -> Iterator[Any]:
        """Profile the block with `torch.profiler`; yields the profiler.

        With `ProfileKwargs(output_trace_dir=...)` each process writes a Chrome trace there when the block
        ends.

        Args:
            profile_handler (ProfileKwargs | None): Settings for this block; None uses the `ProfileKwargs`
                given to the Accelerator (or the defaults).

        Yields:
            torch.profiler.profile: The running profiler.
        """

        with profile(profile_handler or self.profile_handler, self.state) as profiler:
            yield profiler
