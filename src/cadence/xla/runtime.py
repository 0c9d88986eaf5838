"""torch_xla, reached lazily: whether this process trains on an XLA device, and the few runtime calls
Cadence makes (device, ordinals, graph cuts, rendezvous, the XLA generator).

Detection uses `importlib.util.find_spec`, never an import: `import cadence` does not load torch_xla
(importing it costs seconds). torch_xla is imported the first time an XLA device is actually used.

Example::

    from cadence.xla import runtime as xla_runtime
    if xla_runtime.xla_requested(cpu=False, launch={}):
        device = xla_runtime.device()
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from typing import Any

from ..core.settings import parse_bool, resolve

# The process-group backend torch_xla registers ("xla"), and its init method.
XLA_BACKEND = "xla"
XLA_INIT_METHOD = "xla://"


class XlaUnavailableError(ImportError):
    """XLA was asked for explicitly but torch_xla is not installed."""


def installed() -> bool:
    """Whether torch_xla is installed (found without importing it)."""
    return importlib.util.find_spec("torch_xla") is not None


def loaded() -> bool:
    """Whether torch_xla has been imported in this process (only then can XLA state exist)."""
    return "torch_xla" in sys.modules


def _flag(name: str, launch: dict[str, Any] | None) -> bool | None:
    found = resolve(name, None, None, launch)
    if found.value is None:
        return None
    if isinstance(found.value, bool):
        return found.value
    return parse_bool(found.value, found.source.removeprefix("env:"))


def tpu_present() -> bool:
    """Whether this machine looks like a TPU VM (TPU_ACCELERATOR_TYPE set, or /dev/accel0 present),
    without importing torch_xla. (VFIO devices are not taken as a TPU: GPU hosts have them too; on TPU
    generations exposed through VFIO, set PJRT_DEVICE=TPU as torch_xla's documentation says.)"""
    if resolve("tpu_accelerator_type", launch={}).value:
        return True
    return os.path.exists("/dev/accel0")


def xla_requested(cpu: bool, launch: dict[str, Any] | None = None) -> bool:
    """Whether this process should train on an XLA device.

    `cpu=True`, a device named in CADENCE_TORCH_DEVICE, `CADENCE_USE_XLA=0` or Accelerate's
    `USE_TORCH_XLA=0` win. Otherwise XLA is used when torch_xla is installed and either
    `CADENCE_USE_XLA=1` (or the launch record of `cadence launch --tpu`) asks for it, `PJRT_DEVICE` is set,
    or a TPU is present. `CADENCE_USE_XLA=1` without torch_xla is an error.
    """
    if cpu:
        return False
    if resolve("torch_device", launch={}).value:
        return False
    asked = _flag("use_xla", launch)
    if asked is False or _flag("use_torch_xla", {}) is False:
        return False
    if not installed():
        if asked:
            raise XlaUnavailableError(
                "XLA was asked for (CADENCE_USE_XLA=1 or `cadence launch --tpu`) but torch_xla is not "
                "installed: `pip install torch-xla` (its version must match torch's), or drop the flag."
            )
        return False
    return bool(asked) or bool(resolve("pjrt_device", launch={}).value) or tpu_present()


def planned_device_kind() -> str:
    """The device kind the runtime will pick: PJRT_DEVICE, else "TPU" on a TPU VM, else "CPU"."""
    chosen = resolve("pjrt_device", launch={}).value
    if chosen:
        return str(chosen).upper()
    return "TPU" if tpu_present() else "CPU"


def mp_device_loader_requested() -> bool:
    """Whether prepared dataloaders go through torch_xla's MpDeviceLoader thread, as in Accelerate
    (CADENCE_XLA_MP_DEVICE_LOADER=1), instead of Cadence's in-order transfer (see docs/differences.md)."""
    return bool(_flag("xla_mp_device_loader", {}))


# -- torch_xla's modules, imported on first use ----------------------------------------------------
def torch_xla() -> Any:
    """The `torch_xla` module."""
    return importlib.import_module("torch_xla")


def xm() -> Any:
    """`torch_xla.core.xla_model`."""
    return importlib.import_module("torch_xla.core.xla_model")


def xr() -> Any:
    """`torch_xla.runtime`."""
    return importlib.import_module("torch_xla.runtime")


def device() -> Any:
    """This process's XLA device."""
    return torch_xla().device()


def world_size() -> int:
    """Number of XLA processes (replicas) taking part."""
    return int(xr().world_size())


def global_ordinal() -> int:
    """This process's rank among the XLA processes."""
    return int(xr().global_ordinal())


def local_ordinal() -> int:
    """This process's rank on its machine."""
    return int(xr().local_ordinal())


def device_count() -> int:
    """Number of XLA devices of this host's runtime (asking does not switch SPMD on or off)."""
    return int(xr().global_runtime_device_count())


def device_kind() -> str:
    """The runtime's device kind: "TPU", "CPU", "CUDA", ..."""
    return str(xr().device_type())


def spmd_active() -> bool:
    """Whether the SPMD mode of torch_xla is on (one process drives every device)."""
    return loaded() and bool(xr().is_spmd())


def start_spmd() -> None:
    """Switch torch_xla to SPMD (one process drives every device). Must run before this process first
    uses its XLA device: afterwards the switch would replicate live tensors and can crash the runtime."""
    if not xr().is_spmd():
        xr().use_spmd()


_syncs = 0  # graph cuts made through `sync`, so a second cut at the same boundary can be skipped


def sync() -> None:
    """Cut the lazy graph here and run it (a step boundary)."""
    global _syncs
    torch_xla().sync()
    _syncs += 1


def sync_count() -> int:
    """How many graph cuts `sync` has made in this process."""
    return _syncs


def rendezvous(tag: str) -> None:
    """Block until every XLA process reaches the rendezvous called `tag`."""
    xm().rendezvous(tag)


def start_process_group() -> None:
    """The torch.distributed process group over torch_xla's "xla" backend (several replicas)."""
    import torch.distributed as dist

    importlib.import_module("torch_xla.distributed.xla_backend")  # registers the backend
    if not dist.is_initialized():
        dist.init_process_group(XLA_BACKEND, init_method=XLA_INIT_METHOD)


def get_rng_state() -> int:
    """The seed state of the XLA generator of this device."""
    return int(xm().get_rng_state())


def set_rng_state(seed: int) -> None:
    """Set the XLA generator of this device."""
    xm().set_rng_state(int(seed))


def spmd() -> Any:
    """`torch_xla.distributed.spmd` (meshes, `mark_sharding`)."""
    return importlib.import_module("torch_xla.distributed.spmd")


def global_mesh() -> Any:
    """The SPMD mesh set by the XLA strategy, or None (one device per process)."""
    if not spmd_active():
        return None
    return spmd().get_global_mesh()
