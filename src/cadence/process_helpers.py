"""Process-level helpers of the public API: `wait_for_everyone`, `save` (by the main process) and
`load` (weights-only with numpy allowed), local port checks and the kernel-version warning.
"""

from __future__ import annotations

import codecs
import logging
import os
import platform
import re
import socket
from collections import OrderedDict
from typing import Any

import numpy as np
import torch
from packaging.version import Version

from .checkpointing.serialization import save as _write_file
from .core.availability import is_weights_only_available
from .runtime.state import PartialState
from .training.model_helpers import clean_state_dict_for_safetensors

logger = logging.getLogger(__name__)

MIN_LINUX_KERNEL = "5.5.0"

# Globals `load` allows under `weights_only=True`: numpy arrays and dtypes (RNG states hold them).
TORCH_SAFE_GLOBALS: list[Any] = [
    (np._core if hasattr(np, "_core") else np.core).multiarray._reconstruct,
    np.ndarray,
    codecs.encode,
    np.dtype,
]
if hasattr(np, "dtypes") and hasattr(np.dtypes, "UInt32DType"):
    TORCH_SAFE_GLOBALS.append(np.dtypes.UInt32DType)


def _partial_state() -> Any:

    return PartialState()


def wait_for_everyone() -> None:
    """Block until every process of the job reaches this call (a barrier; no-op on one process).

    Every process must call it, or the others wait forever.
    """
    _partial_state().wait_for_everyone()


def save(
    obj: Any,
    f: str | os.PathLike | Any,
    save_on_each_node: bool = False,
    safe_serialization: bool = False,
) -> None:
    """`torch.save` by one process: the main process, or each node's local main process with
    `save_on_each_node=True`; safetensors (aliases dropped) with `safe_serialization=True`.

    Example:
        >>> save({"w": torch.ones(2)}, "weights.pt")  # written once, whatever the number of processes

    Args:
        obj (Any): What to save (a state dict for `safe_serialization`).
        f (str | os.PathLike | Any): The path (or open binary file) to write.
        save_on_each_node (bool): Write once per node instead of once in all (for nodes that do not
            share a file system); default False.
        safe_serialization (bool): Write safetensors instead of a pickle (default False).
    """
    state = _partial_state()
    writer = state.is_local_main_process if save_on_each_node else state.is_main_process
    if not writer:
        return
    if safe_serialization and isinstance(obj, OrderedDict):
        obj = clean_state_dict_for_safetensors(obj)
    _write_file(obj, f, safe_serialization=safe_serialization)


def load(f: str | os.PathLike | Any, map_location: Any = None, **kwargs: Any) -> Any:
    """`torch.load` that defaults to `weights_only=True` while allowing numpy arrays and dtypes
    (`TORCH_SAFE_GLOBALS`); pass `weights_only=False` for trusted pickles.

    Example:
        >>> import torch
        >>> torch.save({"w": torch.ones(2)}, "weights.pt")
        >>> load("weights.pt", map_location="cpu")["w"]
        tensor([1., 1.])

    Args:
        f (str | os.PathLike | Any): A path or an open binary file.
        map_location (Any): Where the tensors are loaded, as for `torch.load` (None: where they were
            saved).
        **kwargs: Any other argument of `torch.load` (`weights_only` included).

    Returns:
        The loaded object.
    """
    if not is_weights_only_available():
        kwargs.pop("weights_only", None)
        return torch.load(f, map_location=map_location, **kwargs)
    kwargs.setdefault("weights_only", True)
    with torch.serialization.safe_globals(TORCH_SAFE_GLOBALS):
        return torch.load(f, map_location=map_location, **kwargs)


def is_port_in_use(port: int | None = None) -> bool:
    """Whether something listens on `localhost:port` (default 29500, the launcher's port).

    Args:
        port (int | None): The TCP port to probe; None means 29500.

    Returns:
        bool: True when a connection to it succeeds.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        return probe.connect_ex(("localhost", 29500 if port is None else port)) == 0


def get_free_port() -> int:
    """A TCP port on this machine that the OS reports free right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("", 0))
        return probe.getsockname()[1]


def check_os_kernel() -> None:
    """Warn when a Linux kernel is older than 5.5.0, with which distributed jobs can hang."""
    info = platform.uname()
    if info.system != "Linux":
        return
    match = re.search(r"\d+\.\d+\.\d+", info.release)
    if match is None:
        return
    version = match.group(0)
    if Version(version) < Version(MIN_LINUX_KERNEL):
        logger.warning(
            f"Detected kernel version {version}, which is below the recommended minimum of "
            f"{MIN_LINUX_KERNEL}; this can cause the process to hang. It is recommended to upgrade "
            "the kernel to the minimum version or higher."
        )
