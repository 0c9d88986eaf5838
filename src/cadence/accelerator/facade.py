"""The Accelerator: the public API's table of contents.

Every method is a few lines that delegate to the component that owns the concern, each built once in
`__init__` and given what it needs: the resolved settings (`AcceleratorSettings`), the process state, the
strategy (which owns the precision), the `Preparer`, the `GradientAccumulation`, the `TrackerHub`, and
the `PreparedObjects` record they share. No component receives the Accelerator.

This module holds the constructor and `prepare`; the other methods are grouped by concern in the base
classes the `Accelerator` inherits: `StateAttributes` (the state as attributes), `TrainingLoopMethods`
(backward, accumulate, autocast, clipping), `ModelMethods` (unwrap_model, get_state_dict, free_memory),
`ProcessMethods` (execution control and collectives), `TrackingMethods` (trackers and profiling) and
`CheckpointMethods` (save_state, load_state, save_model).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from ..core.prepared import PreparedObjects
from ..core.settings import describe, read_launch_config
from ..options.dataclasses import (
    DataLoaderConfiguration,
    GradientAccumulationPlugin,
    ProjectConfiguration,
)
from ..plugins.resolve import setup_device_mesh
from ..runtime.state import AcceleratorState, GradientState
from ..strategies import StrategyContext, select_strategy
from ..tracking import TrackerHub
from .accumulation import GradientAccumulation
from .checkpoint_methods import CheckpointMethods
from .model_methods import ModelMethods
from .preparation import Preparer
from .process_methods import ProcessMethods
from .settings import AcceleratorSettings
from .state_attributes import StateAttributes
from .stop_on_notice import arm_stop_on_notice
from .tracking_methods import TrackingMethods
from .training_loop_methods import TrainingLoopMethods
from .weak_callback import weakly as _weakly

if TYPE_CHECKING:  # for the signatures only: importing these would load the backends
    from ..core.enums import DynamoBackend, LoggerType, PrecisionType, RNGType
    from ..options.dataclasses import (
        KwargsHandler,
        TorchDynamoPlugin,
    )
    from ..plugins.deepspeed import DeepSpeedPlugin
    from ..plugins.fsdp import FullyShardedDataParallelPlugin
    from ..plugins.megatron import MegatronLMPlugin
    from ..plugins.parallelism import ParallelismConfig, TorchTensorParallelPlugin
    from ..tracking.base import GeneralTracker


class Accelerator(
    StateAttributes,
    TrainingLoopMethods,
    ModelMethods,
    ProcessMethods,
    TrackingMethods,
    CheckpointMethods,
):
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
        self._fault_tolerance = None
        if settings.fault_tolerance is not None:
            from ..fault_tolerance.start import start_fault_tolerance  # deferred: only when on

            self._fault_tolerance = start_fault_tolerance(
                settings.fault_tolerance,
                device=self.state.device,
                group_rank=self.state.process_index,  # each replica group is its own elastic job
                group_world_size=self.state.num_processes,
                group_barrier=self.state.wait_for_everyone,
                syncing=_syncing(self.gradient_state),
                registered=self._prepared.custom_objects,
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
            self._strategy,
            self._prepared,
            self.gradient_state,
            complete_gradients=(
                self._fault_tolerance.average_gradients if self._fault_tolerance else None
            ),
            trains_nothing=self._fault_tolerance.trains_nothing if self._fault_tolerance else None,
        )
        if self._fault_tolerance is not None:  # a healing group receives the micro-step count
            self._fault_tolerance.attach_counter(self._accumulation)
        # The Checkpointer (and checkpoint storage with it) is built on first use: see _checkpointer.
        arm_stop_on_notice(_weakly(self, "save_state"), _weakly(self, "_wait_for_async_save"),
                           settings.project_config, self.process_index, self.num_processes,
                           finish_trackers=self._tracker_hub.end_training)  # fmt: skip

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


def _syncing(gradient_state: GradientState) -> Callable[[], bool]:
    """Whether the current micro-batch ends its optimizer step's window (read when asked)."""
    return lambda: gradient_state.sync_gradients
