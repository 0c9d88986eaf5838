"""Process-wide state: PartialState (the process group), AcceleratorState, GradientState.

Each class shares one state dict per process (every instance sees the same attributes), as the spec says.
`reset_state()` forgets all three, for tests and for running several trainings in one process.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from ..core.enums import DistributedType
from ..core.input_errors import forgotten_state_error
from ..core.settings import device_from_env, read_launch_config, resolve_flag
from ..core.shared_state import ThreadLocalSharedDict as ThreadLocalSharedDict
from ..core.shared_state import do_nothing as do_nothing
from ..diagnostics.settings import resolve_watch_settings
from ..plugins.resolve import ParallelPlugins, configure_state
from ..precision.choice import PrecisionChoice, choose_precision
from ..precision.choice import resolve_mixed_precision as resolve_mixed_precision
from ..xla import runtime as xla_runtime
from ..xla.spmd import spmd_plan
from . import process_control as execution
from . import process_group
from .execution_control import ExecutionControl
from .gradient_state import GradientState as GradientState
from .process_group import choose_device, distributed_type_for
from .topology import Topology, detect_topology

if TYPE_CHECKING:  # for the signatures only: importing the plugins would load their backends
    from ..options.dataclasses import TorchDynamoPlugin
    from ..plugins.deepspeed import DeepSpeedPlugin
    from ..plugins.fsdp import FullyShardedDataParallelPlugin
    from ..plugins.megatron import MegatronLMPlugin
    from ..plugins.parallelism import ParallelismConfig, TorchTensorParallelPlugin


class PartialState(ExecutionControl):
    """This process's place in the job: its rank, how many processes there are, and its device.

    Usable without an Accelerator (for inference, data preparation, or a script that only needs to know
    who it is). The first `PartialState()` of a process reads the launch environment (`cadence launch`,
    `torchrun`, SLURM, MPI) and, with more than one process, starts the torch.distributed process group:
    gloo on CPU, NCCL with one GPU per local rank on CUDA. An existing process group is adopted. Every
    later `PartialState()` shares the same state, so it can be created anywhere.

    Args:
        cpu (bool): Use the CPU even when a GPU is visible (default False; also `ACCELERATE_USE_CPU`
            or `cadence launch --cpu`).
        **kwargs: Settings of the process group: `backend` ("gloo", "nccl", ...), `timeout`
            (seconds or a `timedelta`), `init_method`, and Cadence's `stuck_timeout` (seconds a
            collective may wait for a missing rank before every rank stops with a report; 0 turns it
            off). A bad value raises ValueError before anything starts.

    Raises:
        ValueError: A device name or a setting that cannot be used (the message says which).

    Example:
        >>> from cadence import PartialState
        >>> state = PartialState()
        >>> state.process_index, state.num_processes, state.is_main_process
        (0, 1, True)
    """

    _shared_state: dict[str, Any] = {}

    def __init__(self, cpu: bool = False, **kwargs: Any) -> None:
        self.__dict__ = self._shared_state
        if self.initialized:
            return
        launch = read_launch_config()
        device_from_env()  # a bad device name fails here, before any state is set
        cpu = resolve_flag("use_cpu", cpu, launch).value
        topology = detect_topology()
        # Both fail on bad values before any side effect.
        watch = resolve_watch_settings(kwargs.get("stuck_timeout"), launch)
        self.debug = resolve_flag("debug", None, launch).value
        self.fork_launched = resolve_flag("fork_launched", None, launch).value
        self.topology = topology
        xla = xla_runtime.xla_requested(cpu, launch)
        group_exists = dist.is_available() and dist.is_initialized()
        alone = (
            group_exists and not cpu and resolve_flag("ignore_process_group", None, launch).value
        )
        if xla:  # torch_xla's runtime knows the replicas (xmp.spawn), not the torchrun variables
            self._start_xla()
        elif group_exists and not alone:
            self._adopt_process_group(topology, cpu)
        elif topology.world_size > 1 and not alone:
            self._start_process_group(topology, cpu, launch, kwargs)
        else:
            self.backend = None
            self.num_processes = 1
            self.process_index = 0
            self.local_process_index = 0
            self.device = choose_device(cpu, 0, 1)
        self.distributed_type = (
            DistributedType.XLA if xla else distributed_type_for(self.backend, self.num_processes)
        )
        self.use_cpu = cpu or self.device.type == "cpu"
        self._check_launch_expectations(launch)
        if self.use_distributed and not xla:  # the watchdog's handshakes run on gloo/NCCL groups
            from ..diagnostics.watchdog import (  # deferred: the watchdog loads only with several processes
                start_watchdog,
            )

            start_watchdog(self, watch)

    # -- set-up ---------------------------------------------------------------------------------
    def _adopt_process_group(self, topology: Topology, cpu: bool) -> None:
        self.backend = dist.get_backend()
        self.num_processes = dist.get_world_size()
        self.process_index = dist.get_rank()
        same_world = topology.world_size == self.num_processes
        self.local_process_index = topology.local_rank if same_world else self.process_index
        self.device = choose_device(cpu or self.backend == "gloo", self.local_process_index, 2)

    def _start_xla(self) -> None:
        self.device = xla_runtime.device()
        self.num_processes = xla_runtime.world_size()
        self.process_index = xla_runtime.global_ordinal()
        self.local_process_index = xla_runtime.local_ordinal()
        self.backend = process_group.start_xla_group(self.num_processes)

    def _start_process_group(
        self, topology: Topology, cpu: bool, launch: dict[str, Any], kwargs: dict[str, Any]
    ) -> None:
        self.num_processes = topology.world_size
        self.process_index = topology.rank
        self.local_process_index = topology.local_rank
        self.device = choose_device(cpu, topology.local_rank, topology.world_size)
        self.backend = process_group.start_process_group(topology, self.device, launch, kwargs)

    def _check_launch_expectations(self, launch: dict[str, Any]) -> None:
        expected = launch.get("num_processes")
        if expected is not None and int(expected) != self.num_processes:
            raise RuntimeError(
                f"[rank {self.process_index}] `cadence launch` started {expected} processes but this "
                f"one joined a world of {self.num_processes}. Another launcher or a stale environment "
                "(RANK/WORLD_SIZE) is interfering; launch with `cadence launch` alone."
            )
        expected_backend = launch.get("backend")
        if expected_backend and self.num_processes > 1 and expected_backend != self.backend:
            raise RuntimeError(
                f"[rank {self.process_index}] `cadence launch` planned the {expected_backend!r} backend "
                f"but the process group uses {self.backend!r}."
            )

    # -- attributes -----------------------------------------------------------------------------
    @property
    def initialized(self) -> bool:
        """Whether the shared state has been set up in this process."""
        return self._shared_state != {}

    @property
    def use_distributed(self) -> bool:
        """Whether more than one process takes part (a process group is in use)."""
        return self.distributed_type != DistributedType.NO and self.num_processes > 1

    @property
    def is_main_process(self) -> bool:
        """Whether this is the global main process (rank 0)."""
        return self.process_index == 0

    @property
    def is_local_main_process(self) -> bool:
        """Whether this is the main process of its machine (local rank 0)."""
        return self.local_process_index == 0

    @property
    def is_last_process(self) -> bool:
        """Whether this is the process with the highest rank."""
        return self.process_index == self.num_processes - 1

    @property
    def num_machines(self) -> int:
        """Number of machines (nodes) taking part; 1 when not distributed."""
        return self.topology.num_nodes if self.use_distributed else 1

    def __repr__(self) -> str:
        return (
            f"Distributed environment: {self.distributed_type}{'  Backend: ' + self.backend if self.backend else ''}\n"
            f"Num processes: {self.num_processes}\n"
            f"Process index: {self.process_index}\n"
            f"Local process index: {self.local_process_index}\n"
            f"Device: {self.device}\n"
        )

    # Equal when they describe the same process: every instance shares one state, and a pickled copy
    # (inside a pickled Accelerator) holds the same values. All instances hash alike, consistently.
    def __eq__(self, other: object) -> bool:
        if not isinstance(other, PartialState):
            return NotImplemented
        return self.__dict__ is other.__dict__ or self.__dict__ == other.__dict__

    def __hash__(self) -> int:
        return hash(PartialState)

    @classmethod
    def _reset_state(cls) -> None:
        cls._shared_state.clear()

    def __getattr__(self, name: str) -> Any:  # only for names not found normally
        if not name.startswith("_") and not self._shared_state:
            raise forgotten_state_error("PartialState", name)
        raise AttributeError(f"'PartialState' object has no attribute '{name}'")

    def destroy_process_group(self, group: Any = None) -> None:
        """End the process group, if Cadence started it, and forget it.

        Args:
            group (torch.distributed.ProcessGroup | None): A group to destroy; None means the default group
                (destroyed only when Cadence created it; a group you created stays yours).
        """
        if group is None:
            process_group.destroy_owned_group()
        elif dist.is_initialized():
            dist.destroy_process_group(group)
        process_group.disown_group()

    # -- execution control (its methods: execution_control.ExecutionControl) -------------------------
    def _current(self) -> PartialState:
        # The shared state may have been reset since a decorator captured `self`.
        return self if self.initialized else PartialState()

    @property
    def default_device(self) -> torch.device:
        """The device this process trains on (same as `device`)."""
        return self.device


class AcceleratorState:
    """The `PartialState` plus the training settings of the Accelerator: precision, sharding plugins, mesh.

    The Accelerator creates it; read it as `accelerator.state`. Like `PartialState`, every instance in a
    process shares one state: a second Accelerator of the process reuses it, and asking it for another
    mixed precision raises ValueError (call `cadence.state.reset_state()` between trainings).

    Args:
        mixed_precision (str | None): "no", "fp16", "bf16" or "fp8"; None takes the launcher's setting.
        cpu (bool): Use the CPU even when a GPU is visible (default False).
        dynamo_plugin (TorchDynamoPlugin | None): `torch.compile` settings.
        deepspeed_plugin (DeepSpeedPlugin | dict[str, DeepSpeedPlugin] | None): DeepSpeed settings.
        fsdp_plugin (FullyShardedDataParallelPlugin | None): FSDP settings.
        torch_tp_plugin (TorchTensorParallelPlugin | None): Deprecated tensor-parallel settings.
        megatron_lm_plugin (MegatronLMPlugin | None): Megatron-LM settings (not supported by Cadence).
        parallelism_config (ParallelismConfig | None): The sizes of the parallel dimensions.
        **kwargs: Process-group settings, as for `PartialState`.

    Raises:
        ValueError: A precision other than the one the state was created with.

    Example:
        >>> from cadence import Accelerator
        >>> accelerator = Accelerator()
        >>> accelerator.state.mixed_precision, accelerator.state.distributed_type
        ('no', <DistributedType.NO: 'NO'>)
    """

    _shared_state: dict[str, Any] = {}

    def __init__(
        self,
        mixed_precision: str | PrecisionChoice | None = None,
        cpu: bool = False,
        dynamo_plugin: TorchDynamoPlugin | None = None,
        deepspeed_plugin: DeepSpeedPlugin | dict[str, DeepSpeedPlugin] | None = None,
        fsdp_plugin: FullyShardedDataParallelPlugin | None = None,
        torch_tp_plugin: TorchTensorParallelPlugin | None = None,
        megatron_lm_plugin: MegatronLMPlugin | None = None,
        parallelism_config: ParallelismConfig | None = None,
        _from_accelerator: bool = False,
        **kwargs: Any,
    ) -> None:
        self.__dict__ = self._shared_state
        if self.initialized:
            if not PartialState._shared_state:
                # PartialState alone was reset (`PartialState._reset_state()`): set it up again, as
                # the reference does, so the process state is there for everything that reads it.
                partial = PartialState(cpu, **kwargs)
                self.__dict__.update(partial.__dict__)
                self.partial_state = partial
            asked = mixed_precision
            if isinstance(asked, PrecisionChoice):  # an Accelerator's: compared when explicit
                asked = asked.mixed_precision if asked.explicit else None
            if asked is not None and str(asked) != self._mixed_precision:
                raise ValueError(
                    f"AcceleratorState was already created with mixed_precision={self._mixed_precision!r}; "
                    f"a second Accelerator asks for {str(asked)!r}. Create one Accelerator per "
                    "process, or call cadence.state.reset_state() between trainings."
                )
            return
        launch = read_launch_config()
        if not isinstance(mixed_precision, PrecisionChoice):
            # Created directly (not by an Accelerator, whose settings made the choice before any
            # side effect): the same one parse and check, before this one's side effects.
            mixed_precision = choose_precision(
                mixed_precision,
                launch,
                deepspeed=deepspeed_plugin,
                fsdp=fsdp_plugin,
            )
        if (
            (fsdp_plugin is not None or parallelism_config is not None)
            and not PartialState._shared_state
            and xla_runtime.xla_requested(resolve_flag("use_cpu", cpu, launch).value, launch)
        ):
            # An SPMD layout over the XLA devices, checked first; torch_xla must switch to SPMD before
            # the device is first used.
            plan = spmd_plan(
                fsdp_plugin, parallelism_config, xla_runtime.world_size(), xla_runtime.device_count
            )
            if plan is not None:
                xla_runtime.start_spmd()
        partial = PartialState(cpu, **kwargs)
        self.__dict__.update(partial.__dict__)
        self._precision_choice = mixed_precision
        self._mixed_precision = mixed_precision.mixed_precision
        self.dynamo_plugin = dynamo_plugin
        self.deepspeed_plugins = deepspeed_plugin
        self.fsdp_plugin = fsdp_plugin
        self.torch_tp_plugin = torch_tp_plugin
        self.megatron_lm_plugin = megatron_lm_plugin
        self.parallelism_config = parallelism_config
        self.device_mesh = None
        self.partial_state = partial
        plugins = (fsdp_plugin, deepspeed_plugin, parallelism_config)
        # On XLA the FSDP plugin / ParallelismConfig choose an SPMD layout (strategies/xla.py).
        if any(p is not None for p in plugins) and self.distributed_type != DistributedType.XLA:
            try:
                configure_state(self, ParallelPlugins(*plugins))
            except BaseException:
                self._shared_state.clear()
                raise
        if self.distributed_type == DistributedType.FSDP and not dist.is_initialized():
            # fully_shard and torch.distributed.checkpoint need a process group, even of one process.
            process_group.start_single_process_group(self.device)

    initialized = PartialState.initialized
    use_distributed = PartialState.use_distributed
    is_main_process = PartialState.is_main_process
    is_local_main_process = PartialState.is_local_main_process
    is_last_process = PartialState.is_last_process
    num_machines = PartialState.num_machines

    # -- execution control: the process's PartialState, which outlives `AcceleratorState._reset_state()`
    # (as in the reference, a script may reset this state and still end with `state.destroy_process_group()`).
    def destroy_process_group(self, group: Any = None) -> None:
        """End the process group, if Cadence started it (see `PartialState.destroy_process_group`).

        Args:
            group (torch.distributed.ProcessGroup | None): A group to destroy; None means the default group.
        """
        PartialState().destroy_process_group(group)

    def wait_for_everyone(self, timeout: float | timedelta | None = None) -> None:
        """Block until every process reaches this call (see `PartialState.wait_for_everyone`).

        Args:
            timeout (float | datetime.timedelta | None): Give up after this long; None waits up to the
                process group's timeout.
        """
        PartialState().wait_for_everyone(timeout)

    def print(self, *args: Any, **kwargs: Any) -> None:
        """`print` once per machine (see `PartialState.print`).

        Args:
            *args: What to print.
            **kwargs: `print`'s keyword arguments.
        """
        PartialState().print(*args, **kwargs)

    @contextmanager
    def split_between_processes(self, inputs: Any, apply_padding: bool = False) -> Iterator[Any]:
        """This process's share of `inputs` inside the block (see `PartialState.split_between_processes`).

        Args:
            inputs (list | tuple | dict | torch.Tensor): What to split.
            apply_padding (bool): Repeat the last item so every process gets as many (default False).

        Yields:
            This process's share.
        """
        with PartialState().split_between_processes(inputs, apply_padding=apply_padding) as share:
            yield share

    @contextmanager
    def main_process_first(self) -> Iterator[None]:
        """Run the block on the main process first (see `PartialState.main_process_first`)."""
        with PartialState().main_process_first():
            yield

    @contextmanager
    def local_main_process_first(self) -> Iterator[None]:
        """Run the block on each machine's main process first (see `PartialState`)."""
        with PartialState().local_main_process_first():
            yield

    @property
    def precision_choice(self) -> PrecisionChoice:
        """The precision this state was created with, as parsed and checked once (`choose_precision`)."""
        return self._precision_choice

    @property
    def mixed_precision(self) -> str:
        """The mixed precision in use; under DeepSpeed, what its config enables."""
        if self.distributed_type == DistributedType.DEEPSPEED and self._mixed_precision != "fp8":
            config = self.deepspeed_plugin.deepspeed_config
            for name in ("fp16", "bf16"):
                if str(config.get(name, {}).get("enabled", False)).lower() == "true":
                    return name
            return "no"
        return self._mixed_precision

    # -- sharded / model-parallel backends -----------------------------------------------------------
    @property
    def is_fsdp2(self) -> bool:
        """Whether training uses FSDP version 2 (`fully_shard`)."""
        return self.distributed_type == DistributedType.FSDP and self.fsdp_plugin.fsdp_version == 2

    @property
    def deepspeed_plugin(self) -> Any:
        """The active DeepSpeedPlugin (None when not training with DeepSpeed)."""
        if self.distributed_type != DistributedType.DEEPSPEED:
            return None
        plugins = self.deepspeed_plugins
        if not isinstance(plugins, dict):
            return plugins
        return next(plugin for plugin in plugins.values() if plugin.selected)

    def get_deepspeed_plugin(self, name: str) -> DeepSpeedPlugin:
        """The DeepSpeedPlugin given under `name` in `deepspeed_plugins={name: plugin, ...}`.

        Args:
            name (str): The plugin's name.

        Returns:
            DeepSpeedPlugin: The plugin.

        Raises:
            ValueError: DeepSpeed is not in use, or only one unnamed plugin was given.
            KeyError: No plugin has that name.
        """
        self._require_named_deepspeed_plugins()
        return self.deepspeed_plugins[name]

    def select_deepspeed_plugin(self, name: str | None = None) -> None:
        """Make the DeepSpeedPlugin called `name` the active one: the next `prepare()` uses its configuration.

        For a script that trains and evaluates models with different DeepSpeed settings (a policy and a
        frozen reference model, for instance).

        Args:
            name (str | None): The plugin's name, as given in `deepspeed_plugins`.

        Raises:
            ValueError: DeepSpeed is not in use, or only one unnamed plugin was given.
            KeyError: No plugin has that name (the message lists the names).
        """
        self._require_named_deepspeed_plugins()
        if name not in self.deepspeed_plugins:
            raise KeyError(
                f"No DeepSpeedPlugin called {name!r}; the names are {', '.join(self.deepspeed_plugins)}."
            )
        for key, plugin in self.deepspeed_plugins.items():
            if key != name:
                plugin._unselect()
        self.deepspeed_plugins[name].select(_from_accelerator_state=True)

    def _require_named_deepspeed_plugins(self) -> None:
        if self.distributed_type != DistributedType.DEEPSPEED:
            raise ValueError("This needs DeepSpeed: pass deepspeed_plugin(s) to the Accelerator.")
        if not isinstance(self.deepspeed_plugins, dict):
            raise ValueError(
                "Only one DeepSpeedPlugin was given; pass deepspeed_plugins={'name': plugin, ...} to "
                "have several."
            )

    def __getattr__(self, name: str) -> Any:
        # Execution-control methods are PartialState's; this only runs for names not found normally.
        if not name.startswith("_") and not self._shared_state:
            raise forgotten_state_error("AcceleratorState", name)
        if name.startswith("__") or "partial_state" not in self.__dict__:
            raise AttributeError(name)
        try:
            return getattr(self.partial_state, name)
        except AttributeError:
            if hasattr(type(self.partial_state), name):
                raise  # a real attribute that failed inside: keep its own error
            # the name is unknown to both: say so about the object the caller used
            raise AttributeError(f"'AcceleratorState' object has no attribute '{name}'") from None

    def __repr__(self) -> str:
        return repr(self.partial_state) + f"\nMixed precision type: {self.mixed_precision}\n"

    @classmethod
    def _reset_state(cls, reset_partial_state: bool = False) -> None:
        cls._shared_state.clear()
        if reset_partial_state:
            PartialState._reset_state()


def reset_state(destroy_process_group: bool = False) -> None:
    """Forget PartialState, AcceleratorState and GradientState (the process group stays unless asked)."""
    if destroy_process_group:
        process_group.destroy_owned_group()
    execution.forget_groups()
    AcceleratorState._reset_state()
    PartialState._reset_state()
    GradientState._reset_state()


def is_initialized() -> bool:
    """Whether an `AcceleratorState` (hence an `Accelerator`) has been created in this process."""
    return AcceleratorState._shared_state != {}
