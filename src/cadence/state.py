"""Process-wide state: PartialState (the process group), AcceleratorState, GradientState.

Each class shares one state dict per process (every instance sees the same attributes), as the spec says.
`reset_state()` forgets all three, for tests and for running several trainings in one process.
"""

from __future__ import annotations

import atexit
import os
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from .enums import DistributedType, PrecisionType
from .launch_config import read_launch_config
from .shared_state import ThreadLocalSharedDict as ThreadLocalSharedDict
from .shared_state import do_nothing as do_nothing
from .topology import Topology, detect_topology

DEFAULT_PROCESS_GROUP_TIMEOUT = timedelta(minutes=30)
_TRUE = {"1", "true", "yes", "on"}

# Whether Cadence created the process group (and so must destroy it at exit); survives reset_state().
_owns_process_group = False


def env_flag(name: str, default: bool = False) -> bool:
    raw = os.environ.get(name)
    return default if raw is None else raw.strip().lower() in _TRUE


def _destroy_owned_group() -> None:
    global _owns_process_group
    if _owns_process_group and dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
    _owns_process_group = False


atexit.register(_destroy_owned_group)


def _choose_device(cpu: bool, local_rank: int, world_size: int) -> torch.device:
    if not cpu and torch.cuda.is_available():
        count = torch.cuda.device_count()
        if world_size > 1 and local_rank >= count:
            raise RuntimeError(
                f"Local rank {local_rank} has no GPU: this machine has {count}. Start at most {count} "
                "processes per machine, or pass cpu=True / `cadence launch --cpu`."
            )
        device = torch.device("cuda", local_rank % count)
        torch.cuda.set_device(device)
        return device
    if not cpu and world_size == 1:
        mps = getattr(torch.backends, "mps", None)
        if mps is not None and mps.is_available():
            return torch.device("mps")
    # Several CPU processes get `cpu:0`, one `cpu`: what the reference reports.
    return torch.device("cpu", 0) if world_size > 1 else torch.device("cpu")


def _distributed_type_for(backend: str | None, world_size: int) -> DistributedType:
    if world_size <= 1:
        return DistributedType.NO
    return DistributedType.MULTI_GPU if backend == "nccl" else DistributedType.MULTI_CPU


def _as_timeout(value: Any) -> timedelta | None:
    if value is None or isinstance(value, timedelta):
        return value
    return timedelta(seconds=float(value))


class PartialState:
    """The distributed environment of this process, usable without an `Accelerator`.

    World size > 1 starts (or adopts) a torch.distributed process group: gloo on CPU, NCCL with one GPU per
    local rank on CUDA. World size 1 uses no process group.
    """

    _shared_state: dict[str, Any] = {}

    def __init__(self, cpu: bool = False, **kwargs: Any) -> None:
        self.__dict__ = self._shared_state
        if self.initialized:
            return
        launch = read_launch_config()
        cpu = bool(cpu or launch.get("use_cpu") or env_flag("ACCELERATE_USE_CPU"))
        topology = detect_topology()
        from .diagnostics.settings import resolve_watch_settings

        watch = resolve_watch_settings(
            kwargs.get("stuck_timeout"), launch
        )  # fails before side effects
        self.debug = bool(
            launch.get("debug") or env_flag("CADENCE_DEBUG") or env_flag("ACCELERATE_DEBUG_MODE")
        )
        self.fork_launched = env_flag("FORK_LAUNCHED")
        self.topology = topology
        if dist.is_available() and dist.is_initialized():
            self._adopt_process_group(topology, cpu)
        elif topology.world_size > 1:
            self._start_process_group(topology, cpu, launch, kwargs)
        else:
            self.backend = None
            self.num_processes = 1
            self.process_index = 0
            self.local_process_index = 0
            self.device = _choose_device(cpu, 0, 1)
        self.distributed_type = _distributed_type_for(self.backend, self.num_processes)
        self.use_cpu = cpu or self.device.type == "cpu"
        self._check_launch_expectations(launch)
        if self.use_distributed:
            from .diagnostics.watchdog import start_watchdog

            start_watchdog(self, watch)

    # -- set-up ---------------------------------------------------------------------------------
    def _adopt_process_group(self, topology: Topology, cpu: bool) -> None:
        self.backend = dist.get_backend()
        self.num_processes = dist.get_world_size()
        self.process_index = dist.get_rank()
        same_world = topology.world_size == self.num_processes
        self.local_process_index = topology.local_rank if same_world else self.process_index
        self.device = _choose_device(cpu or self.backend == "gloo", self.local_process_index, 2)

    def _start_process_group(
        self, topology: Topology, cpu: bool, launch: dict[str, Any], kwargs: dict[str, Any]
    ) -> None:
        global _owns_process_group
        self.num_processes = topology.world_size
        self.process_index = topology.rank
        self.local_process_index = topology.local_rank
        self.device = _choose_device(cpu, topology.local_rank, topology.world_size)
        backend = kwargs.get("backend") or ("nccl" if self.device.type == "cuda" else "gloo")
        timeout = (
            _as_timeout(kwargs.get("timeout"))
            or _as_timeout(launch.get("process_group_timeout"))
            or DEFAULT_PROCESS_GROUP_TIMEOUT
        )
        init_method = kwargs.get("init_method") or "env://"
        if init_method == "env://":
            os.environ.setdefault("MASTER_ADDR", topology.master_addr)
            os.environ.setdefault("MASTER_PORT", str(topology.master_port))
        extra = {}
        if backend == "nccl":
            extra["device_id"] = self.device
        dist.init_process_group(
            backend=backend,
            init_method=init_method,
            rank=topology.rank,
            world_size=topology.world_size,
            timeout=timeout,
            **extra,
        )
        _owns_process_group = True
        self.backend = backend

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
        return self._shared_state != {}

    @property
    def use_distributed(self) -> bool:
        return self.distributed_type != DistributedType.NO and self.num_processes > 1

    @property
    def is_main_process(self) -> bool:
        return self.process_index == 0

    @property
    def is_local_main_process(self) -> bool:
        return self.local_process_index == 0

    @property
    def is_last_process(self) -> bool:
        return self.process_index == self.num_processes - 1

    @property
    def num_machines(self) -> int:
        return self.topology.num_nodes if self.use_distributed else 1

    def __repr__(self) -> str:
        return (
            f"Distributed environment: {self.distributed_type}{'  Backend: ' + self.backend if self.backend else ''}\n"
            f"Num processes: {self.num_processes}\n"
            f"Process index: {self.process_index}\n"
            f"Local process index: {self.local_process_index}\n"
            f"Device: {self.device}\n"
        )

    @classmethod
    def _reset_state(cls) -> None:
        cls._shared_state.clear()

    def destroy_process_group(self, group: Any = None) -> None:
        """Destroy the process group (only if Cadence created it) and forget this state."""
        global _owns_process_group
        if group is None:
            _destroy_owned_group()
        elif dist.is_initialized():
            dist.destroy_process_group(group)
        _owns_process_group = False

    # -- execution control ----------------------------------------------------------------------
    def wait_for_everyone(self, timeout: float | timedelta | None = None) -> None:
        """Block until every process reaches this point; a no-op on one process."""
        from .execution import barrier

        barrier(self, timeout)

    @contextmanager
    def main_process_first(self):
        """The main process runs the block first, the others after it has left the block."""
        from .execution import go_first

        with go_first(self, local=False):
            yield

    @contextmanager
    def local_main_process_first(self):
        """Each machine's local main process runs the block first; only that machine's ranks wait."""
        from .execution import go_first

        with go_first(self, local=True):
            yield

    @contextmanager
    def split_between_processes(self, inputs: Any, apply_padding: bool = False):
        """Give this process its contiguous share of `inputs` (the argument itself is not modified)."""
        from .execution import split_for_process

        yield split_for_process(inputs, self.num_processes, self.process_index, apply_padding)

    def on_main_process(self, function=None):
        from .execution import run_only_if

        return run_only_if(function, lambda: self.is_main_process)

    def on_local_main_process(self, function=None):
        from .execution import run_only_if

        return run_only_if(function, lambda: self.is_local_main_process)

    def on_last_process(self, function=None):
        from .execution import run_only_if

        return run_only_if(function, lambda: self.is_last_process)

    def on_process(self, function=None, process_index: int | None = None):
        from .execution import run_only_if

        return run_only_if(
            function, lambda: self.process_index == process_index, required_index=process_index
        )

    def on_local_process(
        self, function=None, local_process_index: int | None = None, **kwargs: Any
    ):
        from .execution import run_only_if, take_local_index_alias

        local_process_index = take_local_index_alias(local_process_index, kwargs)
        return run_only_if(
            function,
            lambda: self.local_process_index == local_process_index,
            required_index=local_process_index,
        )

    def print(self, *args: Any, **kwargs: Any) -> None:
        """`print`, once per machine (on each local main process)."""
        if self.is_local_main_process:
            print(*args, **kwargs)

    def set_trigger(self) -> None:
        from .execution import set_trigger

        set_trigger(self)

    def check_trigger(self) -> bool:
        from .execution import check_trigger

        return check_trigger(self)

    @property
    def default_device(self) -> torch.device:
        return self.device


class AcceleratorState:
    """PartialState plus the training settings of the `Accelerator` (precision, plugins)."""

    _shared_state: dict[str, Any] = {}

    def __init__(
        self,
        mixed_precision: str | None = None,
        cpu: bool = False,
        dynamo_plugin: Any = None,
        deepspeed_plugin: Any = None,
        fsdp_plugin: Any = None,
        torch_tp_plugin: Any = None,
        megatron_lm_plugin: Any = None,
        parallelism_config: Any = None,
        _from_accelerator: bool = False,
        **kwargs: Any,
    ) -> None:
        self.__dict__ = self._shared_state
        if self.initialized:
            if mixed_precision is not None and str(mixed_precision) != self._mixed_precision:
                raise ValueError(
                    f"AcceleratorState was already created with mixed_precision={self._mixed_precision!r}; "
                    f"a second Accelerator asks for {str(mixed_precision)!r}. Create one Accelerator per "
                    "process, or call cadence.state.reset_state() between trainings."
                )
            return
        partial = PartialState(cpu, **kwargs)
        self.__dict__.update(partial.__dict__)
        launch = read_launch_config()
        self._mixed_precision = resolve_mixed_precision(mixed_precision, launch)
        self.dynamo_plugin = dynamo_plugin
        self.deepspeed_plugins = deepspeed_plugin
        self.fsdp_plugin = fsdp_plugin
        self.torch_tp_plugin = torch_tp_plugin
        self.megatron_lm_plugin = megatron_lm_plugin
        self.parallelism_config = parallelism_config
        self.device_mesh = None
        self.partial_state = partial
        plugins = (fsdp_plugin, deepspeed_plugin, parallelism_config)
        if any(plugin is not None for plugin in plugins):
            from .plugins.resolve import ParallelPlugins, configure_state

            try:
                configure_state(self, ParallelPlugins(*plugins))
            except BaseException:
                self._shared_state.clear()
                raise

    initialized = PartialState.initialized
    use_distributed = PartialState.use_distributed
    is_main_process = PartialState.is_main_process
    is_local_main_process = PartialState.is_local_main_process
    is_last_process = PartialState.is_last_process
    num_machines = PartialState.num_machines

    @property
    def mixed_precision(self) -> str:
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

    def get_deepspeed_plugin(self, name: str) -> Any:
        self._require_named_deepspeed_plugins()
        return self.deepspeed_plugins[name]

    def select_deepspeed_plugin(self, name: str | None = None) -> None:
        """Make the DeepSpeedPlugin called `name` the active one (for the next prepare())."""
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
        if name.startswith("__") or "partial_state" not in self.__dict__:
            raise AttributeError(name)
        return getattr(self.partial_state, name)

    def __repr__(self) -> str:
        return repr(self.partial_state) + f"\nMixed precision type: {self.mixed_precision}\n"

    @classmethod
    def _reset_state(cls, reset_partial_state: bool = False) -> None:
        cls._shared_state.clear()
        if reset_partial_state:
            PartialState._reset_state()


def resolve_mixed_precision(requested: Any, launch: dict[str, Any]) -> str:
    """Explicit argument > launch config > ACCELERATE_MIXED_PRECISION > "no"; validated."""
    value = requested
    if value is None:
        value = (
            launch.get("mixed_precision") or os.environ.get("ACCELERATE_MIXED_PRECISION") or "no"
        )
    value = str(value).lower()
    if value not in PrecisionType.list():
        raise ValueError(
            f"Unknown mixed_precision {value!r}: choose one of {', '.join(PrecisionType.list())}."
        )
    return value


class GradientState:
    """Whether gradients sync this step, and where the active dataloader stands (end, remainder)."""

    _shared_state: dict[str, Any] = {}

    def __init__(self, gradient_accumulation_plugin: Any = None) -> None:
        self.__dict__ = self._shared_state
        if not self.initialized:
            self.sync_gradients = True
            self.active_dataloader = None
            self.dataloader_references: list[Any] = [None]
            self.plugin_kwargs: dict[str, Any] = {}
            self.is_xla_gradients_synced = False
            self._accumulated_micro_steps = 0
        if gradient_accumulation_plugin is not None:
            self.plugin_kwargs = gradient_accumulation_plugin.to_kwargs()

    @property
    def initialized(self) -> bool:
        return self._shared_state != {}

    @property
    def num_steps(self) -> int:
        return self.plugin_kwargs.get("num_steps", 1)

    @property
    def adjust_scheduler(self) -> bool:
        return self.plugin_kwargs.get("adjust_scheduler", False)

    @property
    def sync_with_dataloader(self) -> bool:
        return self.plugin_kwargs.get("sync_with_dataloader", True)

    @property
    def sync_each_batch(self) -> bool:
        return self.plugin_kwargs.get("sync_each_batch", False)

    @property
    def end_of_dataloader(self) -> bool:
        return bool(getattr(self.active_dataloader, "end_of_dataloader", False))

    @property
    def remainder(self) -> int:
        if self.active_dataloader is None:
            return -1
        return getattr(self.active_dataloader, "remainder", -1)

    @property
    def in_dataloader(self) -> bool:
        return self.active_dataloader is not None

    def _set_sync_gradients(self, sync_gradients: bool) -> None:
        self.sync_gradients = sync_gradients

    def _add_dataloader(self, dataloader: Any) -> None:
        self.active_dataloader = dataloader
        self.dataloader_references.append(dataloader)

    def _remove_dataloader(self, dataloader: Any) -> None:
        if dataloader in self.dataloader_references:
            self.dataloader_references.remove(dataloader)
        self.active_dataloader = self.dataloader_references[-1]

    def __repr__(self) -> str:
        return (
            f"Sync Gradients: {self.sync_gradients}\n"
            f"At end of current dataloader: {self.end_of_dataloader}\n"
            f"Extra samples added: {self.remainder}\n"
            f"Gradient accumulation plugin: {self.plugin_kwargs}\n"
        )

    @classmethod
    def _reset_state(cls) -> None:
        cls._shared_state.clear()


def reset_state(destroy_process_group: bool = False) -> None:
    """Forget PartialState, AcceleratorState and GradientState (the process group stays unless asked)."""
    if destroy_process_group:
        _destroy_owned_group()
    from . import execution

    execution.forget_groups()
    AcceleratorState._reset_state()
    PartialState._reset_state()
    GradientState._reset_state()


def is_initialized() -> bool:
    """Whether an `AcceleratorState` (hence an `Accelerator`) has been created in this process."""
    return AcceleratorState._shared_state != {}
