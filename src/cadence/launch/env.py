"""Launch-environment helpers of the public API (Accelerate's `utils.launch`).

`PrepareForLaunch` (the per-process entry of fork/spawn launchers), `env_var_path_add` and
`prepare_tpu` are real. `prepare_multi_gpu_env` and `prepare_simple_launcher_cmd_env` are computed
from the launch plan (`cadence.commands.reference_env`, a layer above); the DeepSpeed, parallelism and
fp8 builders raise and point to `cadence launch`, which builds those environments itself.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from typing import Any

from ..core.enums import DistributedType
from ..unsupported.sagemaker import prepare_sagemager_args_inputs
from ..xla.runtime import planned_device_kind

_RANKED_TYPES = (
    DistributedType.MULTI_GPU,
    DistributedType.MULTI_MLU,
    DistributedType.MULTI_MUSA,
    DistributedType.MULTI_NPU,
    DistributedType.MULTI_XPU,
    DistributedType.MULTI_CPU,
    DistributedType.MULTI_NEURON,
)
_USE_CADENCE_LAUNCH = (
    "Cadence's launcher computes each process's environment itself (cadence.launch.plan): run "
    "`cadence launch [flags] script.py`, or `cadence launch --dry-run` to print the plan."
)


def env_var_path_add(env_var_name: str, path_to_add: str | os.PathLike) -> str:
    """The value of the path-list variable `env_var_name` with `path_to_add` appended (not set).

    Example:
        >>> os.environ["MY_PATH"] = "/a"
        >>> env_var_path_add("MY_PATH", "/b")
        '/a:/b'

    Args:
        env_var_name (str): A variable holding a `:`-separated list of paths (PYTHONPATH ...).
        path_to_add (str | os.PathLike): The path to put at its end.

    Returns:
        str: The new value (the environment is not changed).
    """
    paths = [part for part in os.environ.get(env_var_name, "").split(":") if part]
    paths.append(str(path_to_add))
    return ":".join(paths)


def prepare_tpu(
    args: argparse.Namespace, current_env: dict[str, str], pod: bool = False
) -> tuple[argparse.Namespace, dict[str, str]]:
    """The environment of a TPU launch, as Accelerate builds it: with bf16 on a TPU,
    `XLA_USE_BF16=1` (or `XLA_DOWNCAST_BF16=1` with `args.downcast_bf16`); with `args.debug`,
    `ACCELERATE_DEBUG_MODE=true`; for a pod, `args.vm` / `args.tpu` from `tpu_vm` / `tpu_name`.

    Example:
        >>> args, env = prepare_tpu(argparse.Namespace(mixed_precision="no", debug=True), {})
        >>> env
        {'ACCELERATE_DEBUG_MODE': 'true'}

    Args:
        args (argparse.Namespace): The parsed `launch` arguments (mixed_precision, downcast_bf16,
            debug, tpu_vm, tpu_name are read).
        current_env (dict[str, str]): The environment being built; updated in place.
        pod (bool): A TPU pod launch (default False).

    Returns:
        tuple[argparse.Namespace, dict[str, str]]: `args` and `current_env`.
    """
    if getattr(args, "mixed_precision", None) == "bf16" and planned_device_kind() == "TPU":
        if getattr(args, "downcast_bf16", False):
            current_env["XLA_DOWNCAST_BF16"] = "1"
        else:
            current_env["XLA_USE_BF16"] = "1"
    if getattr(args, "debug", False):
        current_env["ACCELERATE_DEBUG_MODE"] = "true"
    if pod:
        args.vm = getattr(args, "tpu_vm", None)
        args.tpu = getattr(args, "tpu_name", None)
    return args, current_env


class PrepareForLaunch:
    """Wrap `launcher` so that process `index` of a fork/spawn launch sets its ranks first.

    Args:
        launcher: the function each process runs.
        distributed_type: the job's `DistributedType` (or its value).
        debug: a debug launch (gloo over a file store at `ACCELERATE_DEBUG_RDV_FILE`).

    Example:
        >>> import torch.multiprocessing as mp
        >>> mp.start_processes(PrepareForLaunch(train, "MULTI_CPU"), nprocs=2, start_method="spawn")  # doctest: +SKIP
    """

    def __init__(
        self, launcher: Callable[..., Any], distributed_type: str = "NO", debug: bool = False
    ) -> None:
        self.launcher = launcher
        self.distributed_type = DistributedType(distributed_type)
        self.debug = debug

    def __call__(self, index: int, *args: Any) -> None:
        if self.debug:
            import torch.distributed as dist

            world_size = int(os.environ["WORLD_SIZE"])
            store = dist.FileStore(os.environ["ACCELERATE_DEBUG_RDV_FILE"], world_size)
            dist.init_process_group("gloo", rank=index, store=store, world_size=world_size)
        elif self.distributed_type in _RANKED_TYPES:
            os.environ["LOCAL_RANK"] = str(index)
            per_node = int(os.environ.get("NPROC", 1))
            node_rank = int(os.environ.get("NODE_RANK", 0))
            os.environ["RANK"] = str(per_node * node_rank + index)
        os.environ["FORK_LAUNCHED"] = "1"
        self.launcher(*args)


def _not_cadence(name: str) -> NotImplementedError:
    return NotImplementedError(
        f"`{name}` builds the environment of Accelerate's launcher. {_USE_CADENCE_LAUNCH}"
    )


def prepare_deepspeed_cmd_env(args: argparse.Namespace) -> tuple[list[str], dict[str, str]]:
    """Command and environment of a DeepSpeed launch (see `cadence launch --dry-run`).

    Args:
        args (argparse.Namespace): The parsed `launch` arguments.

    Raises:
        NotImplementedError: Always: `cadence launch` builds its launch environment itself.
    """
    raise _not_cadence("prepare_deepspeed_cmd_env")


def prepare_extend_env_parallelism_config(
    args: argparse.Namespace, current_env: dict[str, str]
) -> dict[str, str]:
    """Parallelism-config variables added to a launch environment (see `cadence launch --dry-run`).

    Args:
        args (argparse.Namespace): The parsed `launch` arguments.
        current_env (dict[str, str]): The environment being built.

    Raises:
        NotImplementedError: Always: `cadence launch` builds its launch environment itself.
    """
    raise _not_cadence("prepare_extend_env_parallelism_config")


def setup_fp8_env(args: argparse.Namespace, current_env: dict[str, str]) -> dict[str, str]:
    """FP8 variables added to a launch environment (see `cadence launch --dry-run`).

    Args:
        args (argparse.Namespace): The parsed `launch` arguments.
        current_env (dict[str, str]): The environment being built.

    Raises:
        NotImplementedError: Always: `cadence launch` builds its launch environment itself.
    """
    raise _not_cadence("setup_fp8_env")


__all__ = [
    "PrepareForLaunch",
    "env_var_path_add",
    "prepare_deepspeed_cmd_env",
    "prepare_extend_env_parallelism_config",
    "prepare_sagemager_args_inputs",
    "prepare_tpu",
    "setup_fp8_env",
]
