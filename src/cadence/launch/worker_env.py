"""What the workers of a launch plan receive: the launch record (`cadence.core.settings`) and their
environment variables."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..core.settings import LAUNCH_CONFIG_ENV, encode_launch_config
from ..runtime import hardware
from .elastic import elastic_worker_env
from .settings import CONFIG, DEEPSPEED_SETTINGS, FSDP_SETTINGS


def launch_record(plan: Any) -> dict[str, Any]:
    """The settings record every worker reads (`cadence.core.settings`), from the resolved `plan`."""
    value = plan.value
    record: dict[str, Any] = {
        # An elastic job's world size changes with its nodes: the workers take it from torch elastic.
        "num_processes": None if plan.elastic else plan.num_processes,
        "num_machines": plan.num_machines,
        "backend": plan.backend,
        "use_cpu": plan.device.value == "cpu",
        "distributed_type": plan.distributed_type,
        "mixed_precision": value("mixed_precision"),
        "debug": value("debug"),
        "main_training_function": value("main_training_function"),
        "enable_cpu_affinity": value("enable_cpu_affinity"),
        "downcast_bf16": value("downcast_bf16"),
    }
    if value("gradient_accumulation_steps") is not None:
        record["gradient_accumulation_steps"] = value("gradient_accumulation_steps")
    if value("dynamo_backend") not in (None, "no"):
        record["dynamo"] = {
            "backend": value("dynamo_backend").upper(),
            "mode": value("dynamo_mode"),
            "fullgraph": value("dynamo_use_fullgraph"),
            "dynamic": value("dynamo_use_dynamic"),
            "regional_compilation": value("dynamo_use_regional_compilation"),
        }
    if plan.distributed_type == "FSDP":
        record["fsdp"] = {name[len("fsdp_") :]: value(name) for name in FSDP_SETTINGS}
    if plan.distributed_type == "DEEPSPEED":
        deepspeed = {name: value(name) for name in DEEPSPEED_SETTINGS}
        deepspeed["fields_from_config"] = sorted(
            [n for n in DEEPSPEED_SETTINGS if plan.settings[n].source == CONFIG]
            + (["mixed_precision"] if plan.settings["mixed_precision"].source == CONFIG else [])
        )
        record["deepspeed"] = deepspeed
    return record


def worker_environment(
    plan: Any, gpu_ids: list[str] | None, env: Mapping[str, str]
) -> dict[str, str]:
    """The variables each worker of `plan` gets on top of the launcher's environment `env`."""
    worker_env = {
        LAUNCH_CONFIG_ENV: encode_launch_config(plan.record),
        "OMP_NUM_THREADS": str(plan.value("num_cpu_threads_per_process")),
    }
    worker_env.update({k: v for k, v in elastic_worker_env(plan).items() if k not in env})
    worker_env.update(pipeline_environment(plan))
    if gpu_ids is not None:
        worker_env["CUDA_VISIBLE_DEVICES"] = ",".join(gpu_ids)
    if not plan.multi_process:
        # What torch elastic would give a world of one, so scripts that call init_process_group work too.
        worker_env.update(
            RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", LOCAL_WORLD_SIZE="1", GROUP_RANK="0",
            MASTER_ADDR=plan.value("main_process_ip"), MASTER_PORT=str(plan.value("main_process_port")),
        )  # fmt: skip
    if plan.num_machines > 1 and plan.backend == "gloo" and "GLOO_SOCKET_IFNAME" not in env:
        # gloo picks its interface from the hostname, which may resolve to 127.0.0.1 (containers,
        # network namespaces): use the interface that actually routes to the main machine.
        local = hardware.local_address_towards(
            plan.value("main_process_ip"), plan.value("main_process_port")
        )
        interface = hardware.interface_with_address(local) if local else None
        if interface:
            worker_env["GLOO_SOCKET_IFNAME"] = interface
    return worker_env


def pipeline_environment(plan: Any) -> dict[str, str]:
    """`--parallelism_config_pp_size N` (and `_pp_schedule`): the variables that make every worker's
    ParallelismConfig a pipeline over N processes, as Accelerate's launcher hands its sizes over."""
    size = plan.value("parallelism_config_pp_size")
    schedule = plan.value("parallelism_config_pp_schedule")
    worker_env: dict[str, str] = {}
    if size is not None:
        worker_env["PARALLELISM_CONFIG_PP_SIZE"] = str(size)
        worker_env["ACCELERATE_USE_PARALLELISM_CONFIG"] = "true"
    if schedule is not None:
        worker_env["PARALLELISM_CONFIG_PP_SCHEDULE"] = str(schedule)
    return worker_env
