"""Ask about NVIDIA GPUs without creating a CUDA context in this process.

A plain `torch.cuda.is_available()` calls `cudaGetDeviceCount`, which initialises the CUDA driver: every
process forked afterwards fails with "Cannot re-initialize CUDA in forked subprocess". The launchers fork
their workers (notebook_launcher's main use is a Colab/Kaggle notebook), so everything Cadence asks in the
parent goes through NVML instead: `torch.cuda.device_count()` counts through NVML while CUDA is not
initialised, and `torch.cuda.is_available()` does when `PYTORCH_NVML_BASED_CUDA_CHECK=1` is set.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

NVML_CHECK_ENV = "PYTORCH_NVML_BASED_CUDA_CHECK"


@contextmanager
def nvml_based_cuda_check() -> Iterator[None]:
    """Within the block, torch answers `torch.cuda.is_available()` through NVML (no CUDA context).

    Example::

        with nvml_based_cuda_check():
            backend = "nccl" if torch.cuda.is_available() else "gloo"
    """
    saved = os.environ.get(NVML_CHECK_ENV)
    os.environ[NVML_CHECK_ENV] = "1"
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop(NVML_CHECK_ENV, None)
        else:
            os.environ[NVML_CHECK_ENV] = saved


def cuda_device_count() -> int:
    """The number of CUDA devices this process may use, counted without initialising CUDA."""
    import torch

    with nvml_based_cuda_check():
        return torch.cuda.device_count() if torch.cuda.is_available() else 0


def cuda_initialized() -> bool:
    """Whether this process already holds a CUDA context (then forked workers cannot use CUDA)."""
    import torch

    return bool(torch.cuda.is_initialized())


def cuda_compute_capability(index: int = 0) -> tuple[int, int] | None:
    """The compute capability of GPU `index` through NVML, or None when NVML cannot say.

    Only uses NVML (the `pynvml` module of nvidia-ml-py, which torch itself uses for this purpose), so
    it is safe to call before forking.
    """
    try:
        import pynvml  # optional dependency
    except ImportError:
        return None
    # NVML numbers every GPU of the machine; CUDA only the visible ones, in CUDA_VISIBLE_DEVICES order.
    visible = [part.strip() for part in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")]
    if os.environ.get("CUDA_VISIBLE_DEVICES") and index < len(visible):
        if not visible[index].isdigit():
            return None  # named by UUID: no cheap mapping, no answer
        index = int(visible[index])
    try:
        pynvml.nvmlInit()
        try:
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(handle)
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # noqa: BLE001 - NVML missing or no driver: no answer, not an error
        return None
    return int(major), int(minor)
