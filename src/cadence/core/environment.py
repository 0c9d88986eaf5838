"""Environment-variable helpers: the one boolean parser, flag/choice/int readers, and context
managers that patch, clear or purge `os.environ`.

This module imports nothing from cadence (and nothing heavy), so every other module — the settings
resolver included — can use `str_to_bool` without an import cycle.
"""

from __future__ import annotations

import functools
import inspect
import logging
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, TypeVar

# Named after the reference's module path, so log filters and captures written for it still match.
logger = logging.getLogger("cadence.utils.environment")

_TRUE_WORDS = frozenset({"y", "yes", "t", "true", "on", "1"})
_FALSE_WORDS = frozenset({"n", "no", "f", "false", "off", "0"})
# Variables a launcher or an Accelerator may leave behind; `purge_accelerate_environment` removes
# new ones of these after the decorated call.
PURGED_PREFIXES = ("ACCELERATE_", "CADENCE_")
_FORBIDDEN_ENV_CHARS = (";", "\n", "<", ">", " ")

T = TypeVar("T")


def str_to_bool(value: str, to_bool: bool = False) -> int | bool:
    """Parse a truth word: y/yes/t/true/on/1 give 1, n/no/f/false/off/0 give 0 (case-insensitive).

    With `to_bool=True` the result is `True`/`False` instead of 1/0. Anything else raises
    `ValueError("invalid truth value ...")`. This is the project's only boolean parser.

    Example:
        >>> str_to_bool("Yes"), str_to_bool("off", to_bool=True)
        (1, False)

    Args:
        value (str): The word to parse (surrounding spaces ignored).
        to_bool (bool): Return a bool instead of 1/0 (default False).

    Returns:
        int | bool: 1 or 0, or True or False with `to_bool`.

    Raises:
        ValueError: A word that is neither true nor false.
    """
    word = str(value).strip().lower()
    if word in _TRUE_WORDS:
        return True if to_bool else 1
    if word in _FALSE_WORDS:
        return False if to_bool else 0
    raise ValueError(f"invalid truth value {value}")


def get_int_from_env(env_keys: Iterable[str], default: int) -> int:
    """Return the first non-negative integer found among the variables `env_keys`, else `default`.

    Args:
        env_keys (Iterable[str]): Variable names, tried in order.
        default (int): The value when none of them holds a non-negative integer.

    Returns:
        int: The first non-negative value found, else `default`.

    Raises:
        ValueError: A variable that is set but not an integer.
    """
    for key in env_keys:
        raw = os.environ.get(key, "-1")
        try:
            value = int(raw)
        except ValueError as error:
            raise ValueError(
                f"Environment variable {key}={raw!r} is not an integer; set it to a whole number or unset it."
            ) from error
        if value >= 0:
            return value
    return default


def parse_flag_from_env(key: str, default: bool = False) -> bool:
    """Whether the variable `key` holds a true word (see `str_to_bool`); `default` when unset.

    Args:
        key (str): The variable's name.
        default (bool): The value when it is unset (default False).

    Returns:
        bool: The flag.

    Raises:
        ValueError: A value that is not a truth word.
    """
    return str_to_bool(os.environ.get(key, str(default))) == 1


def parse_choice_from_env(key: str, default: str = "no") -> str:
    """The raw value of the variable `key`, or `str(default)` when it is unset.

    Args:
        key (str): The variable's name.
        default (str): The value when it is unset (default "no").

    Returns:
        str: The value, unparsed.
    """
    return os.environ.get(key, str(default))


def are_libraries_initialized(*library_names: str) -> list[str]:
    """The names among `library_names` that are already imported in this interpreter.

    Args:
        *library_names (str): Module names, as in `sys.modules` ("torch_xla", "tensorflow" ...).

    Returns:
        list[str]: Those already imported, in the order given.
    """
    return [name for name in library_names if name in sys.modules]


def convert_dict_to_env_variables(current_env: dict[str, str]) -> list[str]:
    """Turn `{"KEY": "value"}` into `["KEY=value\\n", ...]`, skipping (with a warning) entries that
    are empty or hold characters unsafe in an environment file (`; \\n < >` or a space).

    Example:
        >>> convert_dict_to_env_variables({"A": "1", "BAD": "<x", "B": "2"})
        ['A=1\\n', 'B=2\\n']

    Args:
        current_env (dict[str, str]): Variable names and values.

    Returns:
        list[str]: One `KEY=value` line (newline included) per safe entry, in order.
    """
    lines = []
    for key, value in current_env.items():
        text = f"{key}{value}"
        if key and value and not any(char in text for char in _FORBIDDEN_ENV_CHARS):
            lines.append(f"{key}={value}\n")
        else:
            logger.warning(
                f"WARNING: Skipping {key}={value} as it contains forbidden characters or missing values."
            )
    return lines


@dataclass
class CPUInformation:
    """Rank and world sizes of this process in a CPU job, read from the launcher's variables.

    Attributes:
        rank (int): The rank of this process in the job (default 0).
        world_size (int): The number of processes in the job (default 1).
        local_rank (int): The rank of this process on its node (default 0).
        local_world_size (int): The number of processes on this node (default 1).
    """

    rank: int = field(default=0, metadata={"help": "The rank of the current process."})
    world_size: int = field(default=1, metadata={"help": "The number of processes in the job."})
    local_rank: int = field(default=0, metadata={"help": "The rank of this process on its node."})
    local_world_size: int = field(
        default=1, metadata={"help": "The number of processes on this node."}
    )


def get_cpu_distributed_information() -> CPUInformation:
    """Read rank/world size from torchrun's variables or those of the common MPI launchers."""
    return CPUInformation(
        rank=get_int_from_env(
            ["RANK", "PMI_RANK", "OMPI_COMM_WORLD_RANK", "MV2_COMM_WORLD_RANK"], 0
        ),
        world_size=get_int_from_env(
            ["WORLD_SIZE", "PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "MV2_COMM_WORLD_SIZE"], 1
        ),
        local_rank=get_int_from_env(
            [
                "LOCAL_RANK",
                "MPI_LOCALRANKID",
                "OMPI_COMM_WORLD_LOCAL_RANK",
                "MV2_COMM_WORLD_LOCAL_RANK",
            ],
            0,
        ),
        local_world_size=get_int_from_env(
            [
                "LOCAL_WORLD_SIZE",
                "MPI_LOCALNRANKS",
                "OMPI_COMM_WORLD_LOCAL_SIZE",
                "MV2_COMM_WORLD_LOCAL_SIZE",
            ],
            1,
        ),
    )


def get_current_device_type() -> tuple[str, str]:
    """The accelerator kind and distributed type of this machine, without initialising a device.

    Cadence drives CUDA (and ROCm through it) and XPU; anything else is a CPU machine.

    Example:
        >>> get_current_device_type()  # on a CPU-only machine
        ('cpu', 'MULTI_CPU')
    """
    import torch

    if torch.cuda.is_available():
        return "cuda", "MULTI_GPU"
    xpu = getattr(torch, "xpu", None)
    if xpu is not None and xpu.is_available():
        return "xpu", "MULTI_XPU"
    return "cpu", "MULTI_CPU"


def _nvidia_smi() -> str | None:
    return shutil.which("nvidia-smi")


def get_gpu_info() -> tuple[list[str], int]:
    """Names and count of the NVIDIA GPUs `nvidia-smi` reports (`([], 0)` without nvidia-smi)."""
    command = _nvidia_smi()
    if command is None:
        return [], 0
    output = subprocess.run(
        [command, "--query-gpu=name", "--format=csv,noheader"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout
    names = [line.strip() for line in output.splitlines() if line.strip()]
    return names, len(names)


def get_driver_version() -> str | None:
    """The NVIDIA driver version of the first GPU, or None without nvidia-smi."""
    command = _nvidia_smi()
    if command is None:
        return None
    output = subprocess.run(
        [command, "--query-gpu=driver_version", "--format=csv,noheader"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout
    lines = output.strip().splitlines()
    return lines[0].strip() if lines else None


def check_cuda_p2p_ib_support() -> bool:
    """False on machines whose consumer GPUs (RTX 3090/4090 class) lack P2P and InfiniBand support
    with drivers older than 550; True otherwise (NCCL then needs no NCCL_P2P_DISABLE/NCCL_IB_DISABLE)."""
    names, count = get_gpu_info()
    if count <= 1:
        return True
    unsupported = ("RTX 3090", "RTX 3080", "RTX 3070", "RTX 4090", "RTX 4080", "RTX 4070")
    if any(model in name for name in names for model in unsupported):
        version = get_driver_version()
        try:
            major = int(str(version).split(".")[0])
        except ValueError:
            return False
        return major >= 550
    return True


def check_cuda_fp8_capability() -> bool:
    """Whether the current CUDA device supports FP8 (compute capability 8.9 or newer)."""
    import torch

    if not torch.cuda.is_available():
        return False
    return torch.cuda.get_device_capability() >= (8, 9)


def override_numa_affinity(local_process_index: int, verbose: bool | None = None) -> None:
    """Pin this process to the CPUs of the NUMA node closest to its GPU (Linux, NVIDIA only).

    Raises:
        NotImplementedError: NUMA pinning needs NVML's CPU-affinity query, which Cadence does not
            bind; pin with `numactl` or `taskset` in the launch command instead.

    Args:
        local_process_index (int): The process's index on its node (its GPU).
        verbose (bool | None): Log the chosen CPUs.
    """
    raise NotImplementedError(
        "NUMA affinity (override_numa_affinity) needs NVML's CPU-affinity query, which Cadence does not "
        "bind. Pin processes with `numactl --cpunodebind=N` or `taskset` in the launch command instead."
    )


def set_numa_affinity(local_process_index: int, verbose: bool | None = None) -> None:
    """Pin this process to the CPUs of its GPU's NUMA node (see `override_numa_affinity`).

    Args:
        local_process_index (int): The process's index on its node (its GPU).
        verbose (bool | None): Log the chosen CPUs.

    Raises:
        NotImplementedError: Always; see `override_numa_affinity`.
    """
    override_numa_affinity(local_process_index, verbose=verbose)


@contextmanager
def clear_environment() -> Iterator[None]:
    """Empty `os.environ` inside the block; restore it exactly on exit.

    Example:
        >>> os.environ["FOO"] = "bar"
        >>> with clear_environment():
        ...     "FOO" in os.environ
        False
        >>> os.environ["FOO"]
        'bar'
    """
    saved = os.environ.copy()
    os.environ.clear()
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


@contextmanager
def patch_environment(**kwargs: Any) -> Iterator[None]:
    """Set environment variables inside the block, then restore the previous values (or remove them).

    Args:
        **kwargs: Variable names (upper-cased) to values (turned into strings).

    Example:
        >>> import os
        >>> from cadence.utils import patch_environment
        >>> with patch_environment(master_port=29501):
        ...     os.environ["MASTER_PORT"]
        '29501'
        >>> "MASTER_PORT" in os.environ
        False
    """
    previous: dict[str, str | None] = {}
    for key, value in kwargs.items():
        name = key.upper()
        previous.setdefault(name, os.environ.get(name))
        os.environ[name] = str(value)
    try:
        yield
    finally:
        for name, value in previous.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


_PURGE_MARK = "_cadence_purges_environment"


@contextmanager
def _restore_prefixed_variables() -> Iterator[None]:
    before = {k: v for k, v in os.environ.items() if k.startswith(PURGED_PREFIXES)}
    try:
        yield
    finally:
        for key in [k for k in os.environ if k.startswith(PURGED_PREFIXES)]:
            if key not in before:
                del os.environ[key]
        os.environ.update(before)


def purge_accelerate_environment(func_or_cls: T) -> T:
    """Decorator: after the function (or each `test*` method and `setUp`/`tearDown` of a class) runs,
    remove the `ACCELERATE_*`/`CADENCE_*` variables it set and restore the ones it changed. Decorating
    a class also covers the tests of its subclasses.

    Example:
        >>> @purge_accelerate_environment
        ... def make():
        ...     os.environ["ACCELERATE_MIXED_PRECISION"] = "fp16"
        >>> make(); "ACCELERATE_MIXED_PRECISION" in os.environ
        False

    Args:
        func_or_cls (T): A function, or a test class.

    Returns:
        T: The wrapped function, or the same class with its test methods wrapped.
    """

    def wrap(function: Callable[..., Any]) -> Callable[..., Any]:
        if getattr(function, _PURGE_MARK, False):
            return function  # already purging (a method inherited from a decorated class)

        @functools.wraps(function)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            with _restore_prefixed_variables():
                return function(*args, **kwargs)

        setattr(wrapper, _PURGE_MARK, True)
        return wrapper

    def wrap_methods(cls: type) -> None:
        for name, member in list(vars(cls).items()):
            # plain functions only: a staticmethod or classmethod object keeps its own binding
            if inspect.isfunction(member) and (
                name.startswith("test") or name in ("setUp", "tearDown")
            ):
                setattr(cls, name, wrap(member))

    if inspect.isclass(func_or_cls):
        cls = func_or_cls
        wrap_methods(cls)
        # The tests of subclasses purge too (the reference documents decorating a parent class).
        own_hook = vars(cls).get("__init_subclass__")

        def init_subclass(sub: type, **kwargs: Any) -> None:
            if own_hook is not None:
                own_hook.__func__(sub, **kwargs)
            else:
                super(cls, sub).__init_subclass__(**kwargs)
            wrap_methods(sub)

        cls.__init_subclass__ = classmethod(init_subclass)  # type: ignore[assignment]
        return func_or_cls
    return wrap(func_or_cls)  # type: ignore[return-value]


# The same decorator under the package's own name (scripts translated from the reference use it).
purge_cadence_environment = purge_accelerate_environment
