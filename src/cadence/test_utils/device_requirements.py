"""Skip decorators for the machine a test needs: its devices (CPU, GPU, XPU, HPU, TPU, ...), how
many, their precisions, and the torch version. Re-exported by `cadence.test_utils.testing` (the
reference's path).

Importing this module inspects the hardware once: `torch_device`, `device_count` and
`memory_allocated_func` describe this machine.
"""

from __future__ import annotations

import unittest
from collections.abc import Callable
from typing import Any, TypeVar

import torch

from ..core.availability import (
    is_cuda_available,
    is_fp8_available,
    is_fp16_available,
    is_hpu_available,
    is_mlu_available,
    is_mps_available,
    is_musa_available,
    is_neuron_available,
    is_npu_available,
    is_sdaa_available,
    is_torch_xla_available,
    is_transformers_available,
    is_xpu_available,
)
from ..core.environment import check_cuda_fp8_capability
from ..core.versions import is_torch_version

T = TypeVar("T")


def get_backend() -> tuple[str, int, Callable[[], int]]:
    """(device type, device count, function giving allocated device memory) for this machine.

    Example:
        >>> get_backend()[0]  # on a machine without accelerator
        'cpu'
    """
    if is_cuda_available():
        return "cuda", torch.cuda.device_count(), torch.cuda.memory_allocated
    if is_xpu_available():
        return "xpu", torch.xpu.device_count(), torch.xpu.memory_allocated
    if is_mps_available(min_version="2.0"):
        return "mps", 1, torch.mps.current_allocated_memory
    return "cpu", 1, _no_device_memory


def _no_device_memory() -> int:
    """The allocated device memory of a machine without an accelerator: always 0 bytes."""
    return 0


torch_device, device_count, memory_allocated_func = get_backend()


def _fp8_usable() -> bool:
    if not is_fp8_available():
        return False
    if is_cuda_available():
        return check_cuda_fp8_capability()
    return False


def require_torch_min_version(test_case: Any = None, version: str | None = None) -> Any:
    """Skip the decorated test unless torch is at least `version`; usable as
    `@require_torch_min_version(version="2.4")`.

    Args:
        test_case (Any): The test function or TestCase class; None returns a decorator.
        version (str | None): The oldest torch version that runs the test, e.g. "2.4".

    Returns:
        The test, skipped on older torch (or the decorator, without `test_case`).
    """
    if test_case is None:
        return lambda case: require_torch_min_version(case, version=version)
    return unittest.skipUnless(
        is_torch_version(">=", version), f"test requires torch version >= {version}"
    )(test_case)


def require_cpu(test_case: T) -> T:
    """Skip the decorated test unless this machine has only a CPU.

    Args:
        test_case (T): The test function or TestCase class.

    Returns:
        T: The test, skipped where the condition does not hold.
    """
    return unittest.skipUnless(torch_device == "cpu", "test requires only a CPU")(test_case)


def require_non_cpu(test_case: T) -> T:
    """Skip the decorated test unless this machine has a GPU.

    Args:
        test_case (T): The test function or TestCase class.

    Returns:
        T: The test, skipped where the condition does not hold.
    """
    return unittest.skipUnless(torch_device != "cpu", "test requires a GPU")(test_case)


def require_cuda(test_case: T) -> T:
    """Skip the decorated test unless this machine has a GPU.

    Args:
        test_case (T): The test function or TestCase class.

    Returns:
        T: The test, skipped where the condition does not hold.
    """
    return unittest.skipUnless(
        is_cuda_available() and not is_torch_xla_available(), "test requires a GPU"
    )(test_case)


def require_cuda_or_hpu(test_case: T) -> T:
    """Skip the decorated test unless this machine has a GPU or HPU.

    Args:
        test_case (T): The test function or TestCase class.

    Returns:
        T: The test, skipped where the condition does not hold.
    """
    return unittest.skipUnless(
        (is_cuda_available() and not is_torch_xla_available()) or is_hpu_available(),
        "test requires a GPU or HPU",
    )(test_case)


def require_xpu(test_case: T) -> T:
    """Skip the decorated test unless this machine has a XPU.

    Args:
        test_case (T): The test function or TestCase class.

    Returns:
        T: The test, skipped where the condition does not hold.
    """
    return unittest.skipUnless(is_xpu_available(), "test requires a XPU")(test_case)


def require_cuda_or_xpu(test_case: T) -> T:
    """Skip the decorated test unless this machine has a CUDA GPU or XPU.

    Args:
        test_case (T): The test function or TestCase class.

    Returns:
        T: The test, skipped where the condition does not hold.
    """
    return unittest.skipUnless(
        (is_cuda_available() and not is_torch_xla_available()) or is_xpu_available(),
        "test requires a CUDA GPU or XPU",
    )(test_case)


def require_non_xpu(test_case: T) -> T:
    """Skip the decorated test unless this machine has a non-XPU.

    Args:
        test_case (T): The test function or TestCase class.

    Returns:
        T: The test, skipped where the condition does not hold.
    """
    return unittest.skipUnless(torch_device != "xpu", "test requires a non-XPU")(test_case)


def require_non_hpu(test_case: T) -> T:
    """Skip the decorated test unless this machine has a non-HPU.

    Args:
        test_case (T): The test function or TestCase class.

    Returns:
        T: The test, skipped where the condition does not hold.
    """
    return unittest.skipUnless(torch_device != "hpu", "test requires a non-HPU")(test_case)


def require_fp16(test_case: T) -> T:
    """Skip the decorated test unless this machine has FP16 support.

    Args:
        test_case (T): The test function or TestCase class.

    Returns:
        T: The test, skipped where the condition does not hold.
    """
    return unittest.skipUnless(is_fp16_available(), "test requires FP16 support")(test_case)


def require_fp8(test_case: T) -> T:
    """Skip the decorated test unless this machine has FP8 support.

    Args:
        test_case (T): The test function or TestCase class.

    Returns:
        T: The test, skipped where the condition does not hold.
    """
    return unittest.skipUnless(_fp8_usable(), "test requires FP8 support")(test_case)


def require_fsdp2(test_case: T) -> T:
    """Skip the decorated test unless this machine has FSDP2 (torch >= 2.5.0).

    Args:
        test_case (T): The test function or TestCase class.

    Returns:
        T: The test, skipped where the condition does not hold.
    """
    return unittest.skipUnless(
        is_torch_version(">=", "2.5.0"), "test requires FSDP2 (torch >= 2.5.0)"
    )(test_case)


def require_mlu(test_case: T) -> T:
    """Skip the decorated test unless this machine has a MLU.

    Args:
        test_case (T): The test function or TestCase class.

    Returns:
        T: The test, skipped where the condition does not hold.
    """
    return unittest.skipUnless(is_mlu_available(), "test require a MLU")(test_case)


def require_sdaa(test_case: T) -> T:
    """Skip the decorated test unless this machine has a SDAA.

    Args:
        test_case (T): The test function or TestCase class.

    Returns:
        T: The test, skipped where the condition does not hold.
    """
    return unittest.skipUnless(is_sdaa_available(), "test require a SDAA")(test_case)


def require_musa(test_case: T) -> T:
    """Skip the decorated test unless this machine has a MUSA.

    Args:
        test_case (T): The test function or TestCase class.

    Returns:
        T: The test, skipped where the condition does not hold.
    """
    return unittest.skipUnless(is_musa_available(), "test require a MUSA")(test_case)


def require_npu(test_case: T) -> T:
    """Skip the decorated test unless this machine has a NPU.

    Args:
        test_case (T): The test function or TestCase class.

    Returns:
        T: The test, skipped where the condition does not hold.
    """
    return unittest.skipUnless(is_npu_available(), "test require a NPU")(test_case)


def require_neuron(test_case: T) -> T:
    """Skip the decorated test unless this machine has Neuron Cores.

    Args:
        test_case (T): The test function or TestCase class.

    Returns:
        T: The test, skipped where the condition does not hold.
    """
    return unittest.skipUnless(is_neuron_available(), "test require Neuron Cores")(test_case)


def require_mps(test_case: T) -> T:
    """Skip the decorated test unless this machine has a `mps` backend support in `torch`.

    Args:
        test_case (T): The test function or TestCase class.

    Returns:
        T: The test, skipped where the condition does not hold.
    """
    return unittest.skipUnless(
        is_mps_available(), "test requires a `mps` backend support in `torch`"
    )(test_case)


def require_tpu(test_case: T) -> T:
    """Skip the decorated test unless this machine has TPU.

    Args:
        test_case (T): The test function or TestCase class.

    Returns:
        T: The test, skipped where the condition does not hold.
    """
    return unittest.skipUnless(is_torch_xla_available(check_is_tpu=True), "test requires TPU")(
        test_case
    )


def require_non_torch_xla(test_case: T) -> T:
    """Skip the decorated test unless this machine has an env without TorchXLA.

    Args:
        test_case (T): The test function or TestCase class.

    Returns:
        T: The test, skipped where the condition does not hold.
    """
    return unittest.skipUnless(
        not is_torch_xla_available(), "test requires an env without TorchXLA"
    )(test_case)


def require_single_device(test_case: T) -> T:
    """Skip the decorated test unless this machine has a single device accelerator.

    Args:
        test_case (T): The test function or TestCase class.

    Returns:
        T: The test, skipped where the condition does not hold.
    """
    return unittest.skipUnless(
        torch_device != "cpu" and device_count == 1, "test requires a single device accelerator"
    )(test_case)


def require_single_gpu(test_case: T) -> T:
    """Skip the decorated test unless this machine has a GPU.

    Args:
        test_case (T): The test function or TestCase class.

    Returns:
        T: The test, skipped where the condition does not hold.
    """
    return unittest.skipUnless(
        is_cuda_available() and torch.cuda.device_count() == 1, "test requires a GPU"
    )(test_case)


def require_single_xpu(test_case: T) -> T:
    """Skip the decorated test unless this machine has a XPU.

    Args:
        test_case (T): The test function or TestCase class.

    Returns:
        T: The test, skipped where the condition does not hold.
    """
    return unittest.skipUnless(
        is_xpu_available() and torch.xpu.device_count() == 1, "test requires a XPU"
    )(test_case)


def require_multi_device(test_case: T) -> T:
    """Skip the decorated test unless this machine has multiple hardware accelerators.

    Args:
        test_case (T): The test function or TestCase class.

    Returns:
        T: The test, skipped where the condition does not hold.
    """
    return unittest.skipUnless(device_count > 1, "test requires multiple hardware accelerators")(
        test_case
    )


def require_multi_gpu(test_case: T) -> T:
    """Skip the decorated test unless this machine has multiple GPUs.

    Args:
        test_case (T): The test function or TestCase class.

    Returns:
        T: The test, skipped where the condition does not hold.
    """
    return unittest.skipUnless(
        is_cuda_available() and torch.cuda.device_count() > 1, "test requires multiple GPUs"
    )(test_case)


def require_multi_xpu(test_case: T) -> T:
    """Skip the decorated test unless this machine has multiple XPUs.

    Args:
        test_case (T): The test function or TestCase class.

    Returns:
        T: The test, skipped where the condition does not hold.
    """
    return unittest.skipUnless(
        is_xpu_available() and torch.xpu.device_count() > 1, "test requires multiple XPUs"
    )(test_case)


def require_multi_gpu_or_xpu(test_case: T) -> T:
    """Skip the decorated test unless this machine has multiple GPUs or XPUs.

    Args:
        test_case (T): The test function or TestCase class.

    Returns:
        T: The test, skipped where the condition does not hold.
    """
    return unittest.skipUnless(
        (is_cuda_available() or is_xpu_available()) and device_count > 1,
        "test requires multiple GPUs or XPUs",
    )(test_case)


def require_tp(test_case: T) -> T:
    """Skip the decorated test unless this machine has torch version >= 2.3.0 and transformers.

    Args:
        test_case (T): The test function or TestCase class.

    Returns:
        T: The test, skipped where the condition does not hold.
    """
    return unittest.skipUnless(
        is_torch_version(">=", "2.3.0") and is_transformers_available(),
        "test requires torch version >= 2.3.0 and transformers",
    )(test_case)
