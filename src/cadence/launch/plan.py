"""Turn `cadence launch` flags, environment and config file into one validated launch plan.

The plan says where each value came from (see `settings`), holds the settings record the workers
receive (`cadence.core.settings`), their environment, and the exact `torch.distributed.run` arguments.
Building a plan starts nothing; it imports torch only to count GPUs on a machine with a GPU driver.
All problems are collected and reported together in one LaunchPlanError.
"""

from __future__ import annotations

import argparse
import math
import os
import re
import shutil
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..precision.choice import check_precision_supported
from ..runtime import hardware
from ..runtime.cuda_probe import cuda_compute_capability
from . import bounds as launch_bounds
from . import config_file as config_files
from .args import (
    DEEPSPEED_MULTINODE_LAUNCHERS,
    DEEPSPEED_OFFLOAD_DEVICES,
    DYNAMO_BACKENDS,
    DYNAMO_MODES,
    FSDP_AUTO_WRAP_POLICIES,
    FSDP_BACKWARD_PREFETCH,
    FSDP_SHARDING_STRATEGIES,
    FSDP_STATE_DICT_TYPES,
    RDZV_BACKENDS,
)
from .elastic import (
    StoreRole,
    apply_node_range,
    apply_rdzv_endpoint,
    parse_rdzv_bool,
    rendezvous_conf_for,
    store_role,
    torchrun_args,
)
from .settings import (
    CONFIG,
    CPU_SKIPS_DEFAULT_CONFIG,
    DEEPSPEED_SETTINGS,
    DEFAULT,
    DYNAMO_OPTIONS,
    FLAG,
    FSDP_SETTINGS,
    SETTINGS,
    LaunchPlanError,
    Setting,
    SettingsResolver,
    config_values,
    read_config,
)
from .worker_env import launch_record, worker_environment

__all__ = ["LaunchPlan", "LaunchPlanError", "Setting", "build_plan"]

WORKER_BOOTSTRAP_MODULE = "cadence.launch.worker_bootstrap"
LOOPBACK_ADDRESSES = ("127.0.0.1", "localhost", "::1")
PARADIGMS = ("multi_gpu", "use_fsdp", "use_deepspeed")


@dataclass
class LaunchPlan:
    """Everything `cadence launch` will do, decided before anything starts."""

    settings: dict[str, Setting]
    script: str
    script_args: list[str]
    module: bool
    no_python: bool
    device: Setting
    backend: str
    distributed_type: str
    num_processes: int
    num_machines: int
    nproc_per_node: int
    min_nodes: int = 0  # fewest nodes of an elastic job (--nnodes MIN:MAX); 0: num_machines
    record: dict[str, Any] = field(default_factory=dict)
    worker_env: dict[str, str] = field(default_factory=dict)
    torchrun_args: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    store: StoreRole | None = None  # who hosts the rendezvous store (several processes)

    @property
    def config_file(self) -> str | None:
        """The config file the plan was read from, or None."""
        return self.settings["config_file"].value

    def __post_init__(self) -> None:
        self.min_nodes = self.min_nodes or self.num_machines

    @property
    def elastic(self) -> bool:
        """Whether the number of nodes may change while the job runs (--nnodes MIN:MAX)."""
        return self.min_nodes != self.num_machines

    @property
    def multi_process(self) -> bool:
        """Whether torch elastic runs this launch (several processes or machines, restarts, or a
        fault-tolerant replica group: its Manager needs the group's store, which the agent serves)."""
        return (
            self.num_processes > 1
            or self.num_machines > 1
            or self.value("max_restarts") > 0
            or "fault_tolerance" in self.record
        )

    def value(self, name: str) -> Any:
        """The resolved value of the setting `name`."""
        return self.settings[name].value

    def worker_argv(self) -> list[str]:
        """The command each worker runs (torch elastic adds the rank variables to its environment)."""
        if self.no_python:
            return [self.script, *self.script_args]
        target = ["--module", self.script] if self.module else [self.script]
        return [sys.executable, "-u", "-m", WORKER_BOOTSTRAP_MODULE, *target, *self.script_args]


def build_plan(
    args: argparse.Namespace,
    env: Mapping[str, str] | None = None,
    gpu_count: Callable[[], int] = hardware.visible_gpu_count,
    script_required: bool = True,
) -> LaunchPlan:
    """Resolve every setting and validate the whole launch; raises LaunchPlanError listing all problems.

    `script_required=False` plans the environment of a launch whose script is not known yet (the
    reference's `prepare_*_env` helpers): the target is not checked.
    """
    planner = _Planner(args, os.environ if env is None else env, gpu_count)
    planner.script_required = script_required
    return planner.plan()


def _parse_rdzv_conf(text: str) -> dict[str, str]:
    result: dict[str, str] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise LaunchPlanError(
                f"--rdzv_conf item {item!r} is not key=value (e.g. --rdzv_conf timeout=900,is_host=1)"
            )
        result[key.strip()] = value.strip()
    return result


def _gpu_id_list(gpu_ids: str) -> list[str] | None:
    if gpu_ids.strip().lower() == "all":
        return None
    ids = [part.strip() for part in gpu_ids.split(",") if part.strip()]
    if not ids or not all(part.isdigit() for part in ids):
        raise LaunchPlanError(
            f"--gpu_ids {gpu_ids!r} must be 'all' or comma-separated GPU numbers, e.g. 0,1"
        )
    return ids


class _Planner:
    """One pass over the settings: each step resolves a group of values and records its problems."""

    def __init__(
        self, args: argparse.Namespace, env: Mapping[str, str], gpu_count: Callable[[], int]
    ):
        self.args, self.env, self.gpu_count = args, env, gpu_count
        self.script_required = True
        self.explicit = {
            k: v
            for k, v in vars(args).items()
            if k not in ("training_script", "training_script_args")
        }
        self.notes: list[str] = []
        config, config_setting = read_config(self.explicit, env)
        if config_setting.source == CPU_SKIPS_DEFAULT_CONFIG:
            self.notes.append(
                "the default config file was not read because of --cpu (as in accelerate)"
            )
        self.from_config = config_values(config, self.notes) if config is not None else {}
        self.resolve = SettingsResolver(self.explicit, env, self.from_config)
        self.errors = self.resolve.errors
        self.settings: dict[str, Setting] = {"config_file": config_setting}

    def value(self, name: str) -> Any:
        return self.settings[name].value

    def check_choice(self, name: str, choices: tuple[Any, ...]) -> None:
        setting = self.settings[name]
        if setting.value is not None and setting.value not in choices:
            self.errors.append(
                f"--{name} {setting.value!r} ({setting.source}) must be one of: {', '.join(map(str, choices))}"
            )

    def plan(self) -> LaunchPlan:
        self.choose_paradigm()
        for name in SETTINGS:
            self.settings.setdefault(name, self.resolve(name))
        self.choose_device()
        self.count_processes()
        self.choose_rendezvous()
        self.choose_threads()
        self.check_values()
        self.check_bounds()
        self.check_combinations()
        self.check_target()
        problems = list(dict.fromkeys(self.errors))
        if problems:
            raise LaunchPlanError(
                "cadence launch cannot start:\n  - "
                + "\n  - ".join(problems)
                + "\nNothing was started. See `cadence launch --help`."
            )
        plan = LaunchPlan(
            settings=self.settings,
            script=getattr(self.args, "training_script", ""),
            script_args=list(getattr(self.args, "training_script_args", None) or []),
            module=self.module,
            no_python=self.no_python,
            device=self.device,
            backend=self.backend,
            distributed_type=self.distributed_type(),
            num_processes=self.num_processes,
            num_machines=self.machines,
            nproc_per_node=self.nproc_per_node,
            min_nodes=self.min_nodes,
            notes=self.notes,
        )
        plan.record = launch_record(plan)
        plan.worker_env = worker_environment(plan, self.gpu_ids, self.env)
        conf = rendezvous_conf_for(plan, self.rdzv_conf)
        plan.torchrun_args = torchrun_args(plan, conf)
        plan.store = store_role(plan, self.rdzv_conf, conf)
        return plan

    def choose_paradigm(self) -> None:
        # Typed flags (or their environment variables) replace the config file's distributed_type.
        chosen = {name: self.resolve(name) for name in PARADIGMS}
        if any(s.value and s.source != CONFIG for s in chosen.values()):
            chosen = {
                n: s if s.source != CONFIG else Setting(False, DEFAULT) for n, s in chosen.items()
            }
        self.settings.update(chosen)
        self.settings["cpu"] = self.resolve("cpu")
        typed = [
            f"--{n}"
            for n in ("cpu", *PARADIGMS)
            if self.value(n) and self.settings[n].source != CONFIG
        ]
        if len(typed) > 1:
            self.errors.append(
                f"{' and '.join(typed)} cannot be used together: pick one of --cpu, --multi_gpu, "
                "--use_fsdp, --use_deepspeed"
            )
        self.module = bool(self.explicit.get("module", False))
        self.no_python = bool(self.explicit.get("no_python", False))
        if self.module and self.no_python:
            self.errors.append("--module and --no_python cannot be used together")

    def choose_device(self) -> None:
        gpus = 0 if self.value("cpu") else self.gpu_count()
        if self.value("cpu"):
            self.device = Setting("cpu", self.settings["cpu"].source)
        elif gpus > 0:
            self.device = Setting("cuda", "default: GPUs found")
        else:
            self.device = Setting("cpu", "default: no GPU found")
            if self.value("multi_gpu"):
                self.notes.append(
                    f"multi-GPU was requested ({self.settings['multi_gpu'].source}) but no GPU is "
                    "visible: running on CPU with gloo"
                )
        self.backend = "nccl" if self.device.value == "cuda" else "gloo"
        self.gpu_ids = None
        try:  # checked on CPU too (where it is ignored): a typo should not wait for a GPU machine
            gpu_ids = _gpu_id_list(self.value("gpu_ids"))
        except LaunchPlanError as err:
            self.errors.append(str(err))
        else:
            if self.device.value == "cuda":
                self.gpu_ids = gpu_ids
        self.usable_gpus = len(self.gpu_ids) if self.gpu_ids is not None else gpus

    def count_processes(self) -> None:
        self.min_nodes = apply_node_range(self.settings, self.errors, self.notes)
        apply_rdzv_endpoint(self.settings, self.errors)
        machines = self.machines = self.value("num_machines")
        on_gpu = self.device.value == "cuda"
        if self.value("num_processes") is None:
            per_machine = max(1, self.usable_gpus) if on_gpu else 1
            reason = (
                f"{self.usable_gpus} GPU(s) per machine"
                if on_gpu
                else "1 process per machine on CPU"
            )
            self.settings["num_processes"] = Setting(
                per_machine * max(1, machines), f"default: {reason}"
            )
        total = self.num_processes = self.value("num_processes")
        rank = self.value("machine_rank")
        if total < 1:
            self.errors.append(
                f"--num_processes must be at least 1, got {total} ({self.settings['num_processes'].source})"
            )
        if machines < 1:
            self.errors.append(
                f"--num_machines must be at least 1, got {machines} ({self.settings['num_machines'].source})"
            )
        elif not 0 <= rank < machines:
            self.errors.append(
                f"--machine_rank {rank} must be in [0, {machines}) for {machines} machine(s)"
            )
        if total >= 1 and machines >= 1 and total % machines:
            self.errors.append(
                f"--num_processes {total} is the total over all machines and must be divisible by "
                f"--num_machines {machines}"
            )
        self.nproc_per_node = max(1, total // max(1, machines))
        if on_gpu and self.nproc_per_node > self.usable_gpus:
            self.errors.append(
                f"{self.nproc_per_node} processes per machine need {self.nproc_per_node} GPUs but only "
                f"{self.usable_gpus} are usable; lower --num_processes, change --gpu_ids, or pass --cpu"
            )
        if self.value("multi_gpu") and on_gpu and total < 2 and machines == 1:
            self.errors.append("--multi_gpu needs at least 2 processes (--num_processes 2 or more)")

    def choose_rendezvous(self) -> None:
        self.check_choice("rdzv_backend", RDZV_BACKENDS)
        try:
            self.rdzv_conf = _parse_rdzv_conf(self.value("rdzv_conf"))
            if "is_host" in self.rdzv_conf:  # torch would refuse it only once the launch started
                parse_rdzv_bool("is_host", self.rdzv_conf["is_host"])
        except LaunchPlanError as err:
            self.errors.append(str(err))
            self.rdzv_conf = {}
        one_machine = self.machines <= 1
        port = self.settings["main_process_port"]
        if port.value is not None and not 0 <= port.value <= 65535:
            self.errors.append(
                f"--main_process_port {port.value} is not a TCP port (0-65535); pass a port such as "
                "29500, or 0 for a free one"
            )
        elif port.value is None and not one_machine:
            port = Setting(29500, DEFAULT)
        elif port.value in (None, 0) and one_machine:
            reason = (
                "default: a free port"
                if port.value is None
                else f"{port.source}: 0 means a free port"
            )
            port = Setting(hardware.free_port(), reason)
        elif port.value == 0:
            self.errors.append(
                "--main_process_port 0 (a free port) only works on one machine: every machine must know the port"
            )
        self.settings["main_process_port"] = port
        chosen_by_user = port.source in (FLAG, CONFIG) or port.source.startswith("env")
        listens_here = one_machine or self.value("machine_rank") == 0
        if (
            chosen_by_user
            and listens_here
            and 0 < port.value <= 65535
            and hardware.port_in_use(port.value)
        ):
            self.errors.append(
                f"port {port.value} ({port.source}) is already in use on this machine; pick another "
                "--main_process_port" + (", or 0 for any free port" if one_machine else "")
            )
        if one_machine:
            self.rendezvous_on_loopback()
        if not self.value("main_process_ip"):
            if not one_machine:
                self.errors.append(
                    f"--main_process_ip is required with {self.machines} machines: the address of the "
                    "machine of rank 0"
                )
            self.settings["main_process_ip"] = Setting("127.0.0.1", DEFAULT)

    def rendezvous_on_loopback(self) -> None:
        """One machine: every worker is local, so the store listens on 127.0.0.1 only (see
        rendezvous_store), through the static rendezvous, which keeps the store on that port."""
        ip, backend = self.settings["main_process_ip"], self.settings["rdzv_backend"]
        if ip.value and ip.value not in LOOPBACK_ADDRESSES:
            self.notes.append(
                f"--main_process_ip {ip.value} ({ip.source}) is not used on one machine: the workers "
                "meet on 127.0.0.1"
            )
        if backend.value != "static" and backend.value in RDZV_BACKENDS:
            self.notes.append(
                f"--rdzv_backend {backend.value} ({backend.source}) only matters with several machines; "
                "one machine uses the static rendezvous on 127.0.0.1"
            )
            self.settings["rdzv_backend"] = Setting("static", "default: one machine")
        if ip.value != "127.0.0.1":
            self.settings["main_process_ip"] = Setting(
                "127.0.0.1", "default: one machine (loopback)"
            )

    def choose_threads(self) -> None:
        threads = self.settings["num_cpu_threads_per_process"]
        omp = self.env.get("OMP_NUM_THREADS", "")
        if threads.value is not None:
            if threads.value < 1:
                self.errors.append(
                    f"--num_cpu_threads_per_process must be at least 1, got {threads.value}"
                )
            return
        if omp.isdigit() and int(omp) > 0:
            threads = Setting(int(omp), "env OMP_NUM_THREADS")
        elif self.device.value == "cpu":
            cores = hardware.usable_cpu_count()
            threads = Setting(
                max(1, cores // self.nproc_per_node),
                f"default: {cores} cores / {self.nproc_per_node} process(es)",
            )
        else:
            threads = Setting(1, DEFAULT)
        self.settings["num_cpu_threads_per_process"] = threads

    def check_values(self) -> None:
        if self.value("max_restarts") < 0:
            self.errors.append(
                f"--max_restarts must be 0 or more, got {self.value('max_restarts')}"
            )
        if not 0 < self.value("monitor_interval") < math.inf:
            self.errors.append(
                f"--monitor_interval must be a positive number of seconds, got {self.value('monitor_interval')}"
            )
        log_dir = self.value("log_dir")
        if log_dir and Path(log_dir).exists() and not Path(log_dir).is_dir():
            self.errors.append(
                f"--log_dir {log_dir!r} is a file; pass a folder for the worker logs"
            )
        if not re.fullmatch(r"[0-3]|\d+:[0-3](,\d+:[0-3])*", str(self.value("tee"))):
            self.errors.append(
                f"--tee {self.value('tee')!r} must be 0 (none), 1 (stdout), 2 (stderr), 3 (both), or "
                "rank:value pairs like 0:3,1:0"
            )
        self.check_choice("mixed_precision", config_files.MIXED_PRECISION_CHOICES)
        self.check_precision()
        self.check_choice("dynamo_backend", DYNAMO_BACKENDS)
        self.check_choice("dynamo_mode", DYNAMO_MODES)
        steps = self.value("gradient_accumulation_steps")
        if steps is not None and steps < 1:
            self.errors.append(f"--gradient_accumulation_steps must be at least 1, got {steps}")

    def check_precision(self) -> None:
        """The precision the backend cannot run is refused here, before any worker starts."""
        precision = self.value("mixed_precision")
        if precision is None or precision not in config_files.MIXED_PRECISION_CHOICES:
            return
        try:
            check_precision_supported(
                precision,
                device_type=self.device.value,
                engine="deepspeed" if self.value("use_deepspeed") else None,
                # fp8 on a GPU older than Ada/Hopper is refused here (NVML: no CUDA context).
                capability=cuda_compute_capability()
                if precision == "fp8" and self.device.value == "cuda"
                else None,
            )
        except (ImportError, RuntimeError, NotImplementedError, ValueError) as err:
            self.errors.append(
                f"--mixed_precision {precision} ({self.settings['mixed_precision'].source}): {err}"
            )

    def check_bounds(self) -> None:
        """Upper bounds of every count, interval and watchdog setting (see launch_bounds)."""
        self.errors.extend(
            launch_bounds.process_count_problems(
                self.settings,
                self.nproc_per_node,
                self.device.value == "cuda",
                hardware.usable_cpu_count(),
            )
        )
        self.errors.extend(launch_bounds.value_problems(self.settings, self.env))

    def check_combinations(self) -> None:
        """Options that only mean something together with another one."""
        use_fsdp, use_deepspeed = self.value("use_fsdp"), self.value("use_deepspeed")
        for names, owner, enabled in (
            (FSDP_SETTINGS, "--use_fsdp", use_fsdp),
            (DEEPSPEED_SETTINGS, "--use_deepspeed", use_deepspeed),
        ):
            stray = [n for n in names if self.settings[n].source == FLAG and not enabled]
            if stray:
                verb = "apply" if len(stray) > 1 else "applies"
                self.errors.append(
                    f"{', '.join('--' + n for n in stray)} only {verb} with {owner}; add it or drop "
                    f"{'these flags' if len(stray) > 1 else 'the flag'}"
                )
        dynamo_on = self.value("dynamo_backend") not in (None, "no")
        stray = [n for n in DYNAMO_OPTIONS if self.settings[n].source == FLAG and not dynamo_on]
        if stray:
            self.errors.append(
                f"{', '.join('--' + n for n in stray)} need{'' if len(stray) > 1 else 's'} "
                "--dynamo_backend (e.g. --dynamo_backend inductor)"
            )
        if use_fsdp:
            self.check_fsdp()
        if use_deepspeed:
            self.check_deepspeed()
        self.check_pipeline()

    def check_pipeline(self) -> None:
        """--parallelism_config_pp_size / _pp_schedule: a size of at least 1 that divides the
        processes, a schedule torch knows (its validation, without starting a worker)."""
        from ..plugins.pipeline import (
            canonical_schedule,
        )  # deferred: only the pipeline flags need it

        size = self.value("parallelism_config_pp_size")
        if size is not None and (size < 1 or (self.num_processes or size) % size):
            self.errors.append(
                f"--parallelism_config_pp_size {size} must be at least 1 and divide the number of "
                f"processes ({self.num_processes})"
            )
        schedule = self.value("parallelism_config_pp_schedule")
        if schedule is not None:
            try:
                canonical_schedule(schedule)
            except ValueError as error:
                self.errors.append(f"--parallelism_config_pp_schedule: {error}")

    def check_fsdp(self) -> None:
        strategy = self.value("fsdp_sharding_strategy")
        legacy_numbers = {str(i) for i in range(1, len(FSDP_SHARDING_STRATEGIES) + 1)}
        if strategy not in FSDP_SHARDING_STRATEGIES and str(strategy) not in legacy_numbers:
            self.errors.append(
                f"--fsdp_sharding_strategy {strategy!r} must be one of {', '.join(FSDP_SHARDING_STRATEGIES)}"
            )
        self.check_choice("fsdp_auto_wrap_policy", FSDP_AUTO_WRAP_POLICIES)
        self.check_choice("fsdp_backward_prefetch", FSDP_BACKWARD_PREFETCH)
        self.check_choice("fsdp_state_dict_type", FSDP_STATE_DICT_TYPES)
        self.check_choice("fsdp_version", (1, 2))
        if self.value("fsdp_cpu_ram_efficient_loading") and not self.value(
            "fsdp_sync_module_states"
        ):
            self.errors.append(
                "--fsdp_cpu_ram_efficient_loading true needs --fsdp_sync_module_states true"
            )

    def check_deepspeed(self) -> None:
        self.check_choice("zero_stage", (0, 1, 2, 3))
        self.check_choice("offload_optimizer_device", DEEPSPEED_OFFLOAD_DEVICES)
        self.check_choice("offload_param_device", DEEPSPEED_OFFLOAD_DEVICES)
        self.check_choice("deepspeed_multinode_launcher", DEEPSPEED_MULTINODE_LAUNCHERS)
        config_file = self.value("deepspeed_config_file")
        if config_file not in (None, "none") and not Path(config_file).is_file():
            self.errors.append(f"--deepspeed_config_file {config_file!r} does not exist")

    def check_target(self) -> None:
        if self.module or not self.script_required:
            return
        script = self.args.training_script
        if self.no_python:
            if not (Path(script).exists() or shutil.which(script)):
                self.errors.append(
                    f"the program {script!r} was not found (with --no_python it must be an executable)"
                )
        elif not Path(script).is_file():
            self.errors.append(
                f"the script {script!r} does not exist (relative to {os.getcwd()}); pass a path to a "
                "Python file, or -m for a module"
            )

    def distributed_type(self) -> str:
        if self.value("use_fsdp"):
            return "FSDP"
        if self.value("use_deepspeed"):
            return "DEEPSPEED"
        if self.num_processes > 1:
            return "MULTI_GPU" if self.device.value == "cuda" else "MULTI_CPU"
        return "NO"
