"""`cadence launch --tpu` (or a config file with `distributed_type: XLA`): run the script's main function
on this host's XLA devices through torch_xla's launcher (`xmp.spawn`), as Accelerate does.

Everything is checked before anything starts, and all problems are reported together. Multi-host TPU pod
launching (`--tpu_cluster`, `--vm`, `--env`, `--tpu_use_sudo`, several machines) is not done by Cadence:
the message says to run the same single-host command on every host of the pod. The script runs in a
child process (`cadence.launch.xla_worker`), so the launcher itself never imports torch_xla.
"""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

from ..core.settings import LAUNCH_CONFIG_ENV, encode_launch_config
from ..precision.choice import check_precision_supported
from ..xla import runtime as xla_runtime
from .settings import LaunchPlanError, read_config

XLA_WORKER_MODULE = "cadence.launch.xla_worker"
POD_FLAGS = {
    "tpu_use_cluster": "--tpu_cluster",
    "tpu_use_sudo": "--tpu_use_sudo",
    "vm": "--vm",
    "env": "--env",
}
POD_MESSAGE = (
    "launching on a multi-host TPU pod is not supported by Cadence: Cadence launches on one host "
    "(`cadence launch --tpu script.py` uses every TPU chip of this VM). On a pod, run that same command "
    "on every host, e.g. `gcloud compute tpus tpu-vm ssh NAME --worker=all --command='cadence launch "
    "--tpu script.py'`"
)
CONFLICTS = ("cpu", "multi_gpu", "use_deepspeed", "use_fsdp")


def _config(args: argparse.Namespace) -> Any:
    explicit = {k: v for k, v in vars(args).items() if k not in ("training_script",)}
    try:
        return read_config(explicit, os.environ, allow_xla=True)[0]
    except LaunchPlanError:
        return None  # build_plan reports a bad config file with the other problems


def wants_xla(args: argparse.Namespace) -> bool:
    """Whether this launch targets XLA: `--tpu`, or the config file's `distributed_type: XLA` (unless
    another device or paradigm is typed on the command line)."""
    if getattr(args, "tpu", False) or any(getattr(args, name, None) for name in POD_FLAGS):
        return True
    if any(getattr(args, name, False) for name in CONFLICTS):
        return False
    config = _config(args)
    return config is not None and getattr(config, "distributed_type", None) == "XLA"


def _value(args: argparse.Namespace, config: Any, name: str, default: Any) -> Any:
    if hasattr(args, name):
        return getattr(args, name)
    if config is not None and getattr(config, "distributed_type", None) == "XLA":
        found = getattr(config, name, None)
        if found is not None:
            return found
    return default


def _problems(args: argparse.Namespace, config: Any) -> list[str]:
    problems = []
    pod = [flag for name, flag in POD_FLAGS.items() if _value(args, config, name, None)]
    if pod or int(_value(args, config, "num_machines", 1) or 1) > 1:
        problems.append(f"{', '.join(pod) or '--num_machines > 1'}: {POD_MESSAGE}")
    typed = [f"--{name}" for name in CONFLICTS if getattr(args, name, False)]
    if typed and getattr(args, "tpu", False):
        problems.append(
            f"--tpu and {' and '.join(typed)} cannot be used together: pick one of --cpu, --multi_gpu, "
            "--tpu, --use_deepspeed, --use_fsdp (on XLA, FSDPv2 comes from the FSDP plugin in the script)"
        )
    if getattr(args, "no_python", False):
        problems.append("--no_python cannot be used with the TPU launcher")
    if not xla_runtime.installed():
        problems.append(
            "--tpu needs torch_xla, which is not installed here: `pip install torch-xla` (matching "
            "torch's version), or launch without --tpu"
        )
    precision = str(_value(args, config, "mixed_precision", "no") or "no").lower()
    try:
        check_precision_supported(precision, device_type="xla")
    except (ValueError, ImportError, RuntimeError) as error:
        problems.append(f"--mixed_precision {precision}: {error}")
    script = args.training_script
    if not getattr(args, "module", False) and not Path(script).is_file():
        problems.append(
            f"the script {script!r} does not exist (relative to {os.getcwd()}); pass a path to a Python "
            "file, or -m for a module"
        )
    return problems


def plan_environment(args: argparse.Namespace, config: Any) -> tuple[dict[str, str], list[str]]:
    """The variables the XLA processes get (the launch record, PJRT_DEVICE, bf16 switches) and notes."""
    precision = str(_value(args, config, "mixed_precision", "no") or "no").lower()
    record: dict[str, Any] = {
        "use_xla": True,
        "distributed_type": "XLA",
        "mixed_precision": precision,
        "debug": bool(_value(args, config, "debug", False)),
        "main_training_function": _value(args, config, "main_training_function", "main"),
        "downcast_bf16": bool(_value(args, config, "downcast_bf16", False)),
    }
    steps = _value(args, config, "gradient_accumulation_steps", None)
    if steps is not None:
        record["gradient_accumulation_steps"] = int(steps)
    env = {LAUNCH_CONFIG_ENV: encode_launch_config(record)}
    notes = []
    on_tpu = xla_runtime.tpu_present()
    if not os.environ.get("PJRT_DEVICE"):
        env["PJRT_DEVICE"] = "TPU" if on_tpu else "CPU"
        if not on_tpu:
            notes.append(
                "no TPU found on this machine: running on torch_xla's CPU device (PJRT_DEVICE=CPU)"
            )
    if precision == "bf16" and on_tpu:  # the reference's TPU switches (bf16 storage on the chip)
        env["XLA_DOWNCAST_BF16" if record["downcast_bf16"] else "XLA_USE_BF16"] = "1"
    return env, notes


def worker_command(args: argparse.Namespace, config: Any) -> list[str]:
    """The command that imports the script and hands its main function to `xmp.spawn`."""
    function = _value(args, config, "main_training_function", "main")
    processes = _value(args, config, "num_processes", None)
    single = processes is not None and int(processes) == 1
    target = (
        ["--module", args.training_script]
        if getattr(args, "module", False)
        else [args.training_script]
    )
    return [
        sys.executable, "-u", "-m", XLA_WORKER_MODULE,
        "--function", str(function), *(["--single"] if single else []),
        *target, *(args.training_script_args or []),
    ]  # fmt: skip


def xla_launch(args: argparse.Namespace, dry_run: bool = False) -> int:
    """Check, then run (or with `dry_run` only print) the XLA launch; returns the exit code.

    An invalid XLA launch raises `LaunchPlanError` before anything starts."""
    config = _config(args)
    problems = _problems(args, config)
    if problems:  # the command line prints it and exits with code 2, as for any invalid launch
        raise LaunchPlanError(
            "cadence launch cannot start:\n  - "
            + "\n  - ".join(dict.fromkeys(problems))
            + "\nNothing was started. See `cadence launch --help`."
        )
    env, notes = plan_environment(args, config)
    command = worker_command(args, config)
    quiet = bool(getattr(args, "quiet", False))
    lines = [
        "XLA launch through torch_xla (xmp.spawn) on this host",
        *[f"note: {n}" for n in notes],
    ]
    lines += [f"environment: {k}={v}" for k, v in sorted(env.items())]
    lines.append(f"worker command: {shlex.join(command)}")
    if dry_run:
        print("\n".join(lines))
        return 0
    if not quiet:
        print("\n".join(lines[:-1]), file=sys.stderr, flush=True)
    try:
        return subprocess.run(command, env={**os.environ, **env}).returncode
    except KeyboardInterrupt:
        print("cadence launch: interrupted", file=sys.stderr)
        return 130
