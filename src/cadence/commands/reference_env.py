"""Accelerate's launcher-side builders `prepare_multi_gpu_env` and `prepare_simple_launcher_cmd_env`
(public in `utils.launch`), computed from Cadence's launch plan.

Custom launchers written for Accelerate fill an `argparse.Namespace` with every launch flag
(unused ones left at the parser's default: False, None, "no") and ask for the environment of the
processes. Cadence reads that namespace as `cadence launch` would read the same flags, plans the
launch with `build_plan` (the one place that decides), and hands back the plan's worker environment,
with the torchrun fields set on the namespace as Accelerate sets them.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from ..launch.plan import LaunchPlan, build_plan

# Flag groups that only mean something when their switch is on (the reference's namespace carries
# them all, at their defaults).
_GROUPS = {
    "use_fsdp": ("fsdp_",),
    "use_deepspeed": ("deepspeed_", "zero_stage", "zero3_", "offload_", "gradient_clipping"),
    "use_megatron_lm": ("megatron_lm_",),
    "use_tp": ("tp_",),
    "use_parallelism_config": ("parallelism_config_",),
}


def _given(args: argparse.Namespace) -> argparse.Namespace:
    """The flags of `args` that a user would have passed: defaults (None, False, switched-off groups,
    dynamo off) are dropped, as `cadence launch` never sees a flag that was not given."""
    values: dict[str, Any] = {
        k: v for k, v in vars(args).items() if v is not None and v is not False
    }
    for switch, prefixes in _GROUPS.items():
        if not values.get(switch):
            values = {k: v for k, v in values.items() if not k.startswith(prefixes)}
    backend = str(values.get("dynamo_backend", "no")).lower()
    if backend == "no":
        values = {k: v for k, v in values.items() if not k.startswith("dynamo_")}
    else:
        values["dynamo_backend"] = backend
    return argparse.Namespace(**values)


def _plan(args: argparse.Namespace) -> LaunchPlan:
    return build_plan(_given(args), script_required=hasattr(args, "training_script"))


def _environment(plan: LaunchPlan) -> dict[str, str]:
    env = os.environ.copy()
    env.update(plan.worker_env)
    return env


def prepare_multi_gpu_env(args: argparse.Namespace) -> dict[str, str]:
    """The environment of the processes of a torchrun launch of `args` (a namespace of launch flags),
    and the torchrun fields set on `args`: `nproc_per_node`, `nnodes`, `node_rank`, `master_addr`,
    `master_port` (a free port when `main_process_port` is 0 or unset on one machine), `rdzv_backend`,
    `max_restarts`, `monitor_interval`. Bad flags raise LaunchPlanError, as `cadence launch` does.

    Example:
        >>> args = argparse.Namespace(num_processes=2, main_process_port=0, cpu=True)
        >>> env = prepare_multi_gpu_env(args)
        >>> args.master_port.isdigit(), env["OMP_NUM_THREADS"]
        (True, '1')

    Args:
        args (argparse.Namespace): Launch flags (num_processes, main_process_port, cpu ...); updated in
            place.

    Returns:
        dict[str, str]: The processes' environment.
    """
    plan = _plan(args)
    args.nproc_per_node = str(plan.nproc_per_node)
    args.nnodes = str(plan.num_machines)
    args.node_rank = int(plan.value("machine_rank") or 0)
    args.master_addr = str(plan.value("main_process_ip"))
    args.master_port = str(plan.value("main_process_port"))
    args.rdzv_backend = plan.value("rdzv_backend")
    args.max_restarts = plan.value("max_restarts")
    args.monitor_interval = plan.value("monitor_interval")
    return _environment(plan)


def prepare_simple_launcher_cmd_env(args: argparse.Namespace) -> tuple[list[str], dict[str, str]]:
    """The command and environment of a one-process launch of `args.training_script`.

    Example:
        >>> _ = open("train.py", "w").write("print('hello')")
        >>> cmd, env = prepare_simple_launcher_cmd_env(
        ...     argparse.Namespace(training_script="train.py", training_script_args=["--lr", "1"])
        ... )
        >>> cmd[-3:]
        ['train.py', '--lr', '1']

    Args:
        args (argparse.Namespace): Launch flags, with `training_script` and `training_script_args`.

    Returns:
        tuple[list[str], dict[str, str]]: The command and its environment.
    """
    plan = _plan(args)
    command = plan.worker_argv()
    if plan.no_python or plan.module:
        return command, _environment(plan)
    return [sys.executable, "-u", plan.script, *plan.script_args], _environment(plan)
