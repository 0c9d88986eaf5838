"""Testing helpers for projects built on Cadence: skip decorators that answer truthfully for this
machine, test-case bases that reset state or keep a temporary folder, subprocess runners and the
launch command of the bundled test scripts.

Importing this module (not `import cadence`) inspects the hardware once: `torch_device`,
`device_count` and `memory_allocated_func` describe this machine.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import unittest
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import torch

from ..core.availability import (
    is_aim_available,
    is_bnb_available,
    is_clearml_available,
    is_comet_ml_available,
    is_cuda_available,
    is_datasets_available,
    is_deepspeed_available,
    is_dvclive_available,
    is_fp8_available,
    is_fp16_available,
    is_hpu_available,
    is_import_timer_available,
    is_matplotlib_available,
    is_mlflow_available,
    is_mlu_available,
    is_mps_available,
    is_musa_available,
    is_neuron_available,
    is_npu_available,
    is_pandas_available,
    is_peft_available,
    is_pippy_available,
    is_pytest_available,
    is_schedulefree_available,
    is_sdaa_available,
    is_swanlab_available,
    is_tensorboard_available,
    is_timm_available,
    is_torch_xla_available,
    is_torchao_available,
    is_torchdata_stateful_dataloader_available,
    is_torchvision_available,
    is_trackio_available,
    is_transformer_engine_available,
    is_transformer_engine_mxfp8_available,
    is_transformers_available,
    is_triton_available,
    is_wandb_available,
    is_xpu_available,
)
from ..core.environment import check_cuda_fp8_capability, str_to_bool
from ..core.versions import is_torch_version
from ..runtime.collectives import gather
from ..runtime.state import AcceleratorState, GradientState
from .subprocesses import SubprocessCallException as SubprocessCallException
from .subprocesses import assert_exception as assert_exception
from .subprocesses import capture_call_output as capture_call_output
from .subprocesses import execute_subprocess_async as execute_subprocess_async
from .subprocesses import get_torch_dist_unique_port as get_torch_dist_unique_port
from .subprocesses import path_in_accelerate_package as path_in_accelerate_package
from .subprocesses import path_in_cadence_package as path_in_cadence_package
from .subprocesses import pytest_xdist_worker_id as pytest_xdist_worker_id
from .subprocesses import run_command as run_command

T = TypeVar("T")
from .subprocesses import PACKAGE_DIR as PACKAGE_DIR  # noqa: E402


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


def get_launch_command(**kwargs: Any) -> list[str]:
    """`["cadence", "launch", ...]` with each keyword as a flag (`True` -> `--k`, else `--k=v`;
    None and False are left out).

    Example:
        >>> get_launch_command(num_processes=2, cpu=True)
        ['cadence', 'launch', '--num_processes=2', '--cpu']

    Args:
        **kwargs: `cadence launch` options by name (num_processes=2, cpu=True, mixed_precision="fp16").

    Returns:
        list[str]: The command, without the script to run.
    """
    command = ["cadence", "launch"]
    for key, value in kwargs.items():
        if isinstance(value, bool):
            if value:
                command.append(f"--{key}")
        elif value is not None:
            command.append(f"--{key}={value}")
    return command


DEFAULT_LAUNCH_COMMAND = get_launch_command(num_processes=device_count, monitor_interval=0.1)


def parse_flag_from_env(key: str, default: bool = False) -> Any:
    """`str_to_bool` of the variable `key` (1/0), or `default` when unset.

    Raises:
        ValueError: the variable is set to something other than a yes/no word.

    Args:
        key (str): The variable's name.
        default (bool): The value when it is unset (default False).

    Returns:
        1 or 0 when set, else `default`.
    """
    if key not in os.environ:
        return default
    try:
        return str_to_bool(os.environ[key])
    except ValueError:
        raise ValueError(f"If set, {key} must be yes or no.") from None


_run_slow_tests = parse_flag_from_env("RUN_SLOW", default=False)


def skip(test_case: T) -> T:
    """Skip the decorated test unconditionally.

    Args:
        test_case (T): The test function or TestCase class.

    Returns:
        T: The test, skipped where the condition does not hold.
    """
    return unittest.skip("Test was skipped")(test_case)


def slow(test_case: T) -> T:
    """Skip the decorated (slow) test unless RUN_SLOW is set to a true word.

    Args:
        test_case (T): The test function or TestCase class.

    Returns:
        T: The test, skipped where the condition does not hold.
    """
    return unittest.skipUnless(_run_slow_tests, "test is slow")(test_case)


def _fp8_usable() -> bool:
    if not is_fp8_available():
        return False
    if is_cuda_available():
        return check_cuda_fp8_capability()
    return False


_at_least_one_tracker = (
    any(
        [
            is_wandb_available(),
            is_tensorboard_available(),
            is_trackio_available(),
            is_swanlab_available(),
        ]
    )
    and not is_comet_ml_available()
)


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


def require_peft(test_case: T) -> T:
    """Skip the decorated test unless this machine has PEFT.

    Args:
        test_case (T): The test function or TestCase class.

    Returns:
        T: The test, skipped where the condition does not hold.
    """
    return unittest.skipUnless(is_peft_available(), "test requires PEFT")(test_case)


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


def require_huggingface_suite(test_case: T) -> T:
    """Skip the decorated test unless this machine has the Hugging Face suite.

    Args:
        test_case (T): The test function or TestCase class.

    Returns:
        T: The test, skipped where the condition does not hold.
    """
    return unittest.skipUnless(
        is_transformers_available() and is_datasets_available(),
        "test requires the Hugging Face suite",
    )(test_case)


def require_datasets(test_case: T) -> T:
    """Skip the decorated test unless this machine has the datasets library.

    Args:
        test_case (T): The test function or TestCase class.

    Returns:
        T: The test, skipped where the condition does not hold.
    """
    return unittest.skipUnless(is_datasets_available(), "test requires the datasets library")(
        test_case
    )


def require_transformers(test_case: T) -> T:
    """Skip the decorated test unless this machine has the transformers library.

    Args:
        test_case (T): The test function or TestCase class.

    Returns:
        T: The test, skipped where the condition does not hold.
    """
    return unittest.skipUnless(
        is_transformers_available(), "test requires the transformers library"
    )(test_case)


def require_timm(test_case: T) -> T:
    """Skip the decorated test unless this machine has the timm library.

    Args:
        test_case (T): The test function or TestCase class.

    Returns:
        T: The test, skipped where the condition does not hold.
    """
    return unittest.skipUnless(is_timm_available(), "test requires the timm library")(test_case)


def require_torchvision(test_case: T) -> T:
    """Skip the decorated test unless this machine has the torchvision library.

    Args:
        test_case (T): The test function or TestCase class.

    Returns:
        T: The test, skipped where the condition does not hold.
    """
    return unittest.skipUnless(is_torchvision_available(), "test requires the torchvision library")(
        test_case
    )


def require_triton(test_case: T) -> T:
    """Skip the decorated test unless this machine has the triton library.

    Args:
        test_case (T): The test function or TestCase class.

    Returns:
        T: The test, skipped where the condition does not hold.
    """
    return unittest.skipUnless(is_triton_available(), "test requires the triton library")(test_case)


def require_schedulefree(test_case: T) -> T:
    """Skip the decorated test unless this machine has the schedulefree library.

    Args:
        test_case (T): The test function or TestCase class.

    Returns:
        T: The test, skipped where the condition does not hold.
    """
    return unittest.skipUnless(
        is_schedulefree_available(), "test requires the schedulefree library"
    )(test_case)


def require_bnb(test_case: T) -> T:
    """Skip the decorated test unless this machine has the bitsandbytes library.

    Args:
        test_case (T): The test function or TestCase class.

    Returns:
        T: The test, skipped where the condition does not hold.
    """
    return unittest.skipUnless(is_bnb_available(), "test requires the bitsandbytes library")(
        test_case
    )


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


def require_deepspeed(test_case: T) -> T:
    """Skip the decorated test unless this machine has DeepSpeed.

    Args:
        test_case (T): The test function or TestCase class.

    Returns:
        T: The test, skipped where the condition does not hold.
    """
    return unittest.skipUnless(is_deepspeed_available(), "test requires DeepSpeed")(test_case)


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


def require_tensorboard(test_case: T) -> T:
    """Skip the decorated test unless this machine has Tensorboard.

    Args:
        test_case (T): The test function or TestCase class.

    Returns:
        T: The test, skipped where the condition does not hold.
    """
    return unittest.skipUnless(is_tensorboard_available(), "test requires Tensorboard")(test_case)


def require_wandb(test_case: T) -> T:
    """Skip the decorated test unless this machine has wandb.

    Args:
        test_case (T): The test function or TestCase class.

    Returns:
        T: The test, skipped where the condition does not hold.
    """
    return unittest.skipUnless(is_wandb_available(), "test requires wandb")(test_case)


def require_trackio(test_case: T) -> T:
    """Skip the decorated test unless this machine has trackio.

    Args:
        test_case (T): The test function or TestCase class.

    Returns:
        T: The test, skipped where the condition does not hold.
    """
    return unittest.skipUnless(is_trackio_available(), "test requires trackio")(test_case)


def require_comet_ml(test_case: T) -> T:
    """Skip the decorated test unless this machine has comet_ml.

    Args:
        test_case (T): The test function or TestCase class.

    Returns:
        T: The test, skipped where the condition does not hold.
    """
    return unittest.skipUnless(is_comet_ml_available(), "test requires comet_ml")(test_case)


def require_aim(test_case: T) -> T:
    """Skip the decorated test unless this machine has aim.

    Args:
        test_case (T): The test function or TestCase class.

    Returns:
        T: The test, skipped where the condition does not hold.
    """
    return unittest.skipUnless(is_aim_available(), "test requires aim")(test_case)


def require_clearml(test_case: T) -> T:
    """Skip the decorated test unless this machine has clearml.

    Args:
        test_case (T): The test function or TestCase class.

    Returns:
        T: The test, skipped where the condition does not hold.
    """
    return unittest.skipUnless(is_clearml_available(), "test requires clearml")(test_case)


def require_dvclive(test_case: T) -> T:
    """Skip the decorated test unless this machine has dvclive.

    Args:
        test_case (T): The test function or TestCase class.

    Returns:
        T: The test, skipped where the condition does not hold.
    """
    return unittest.skipUnless(is_dvclive_available(), "test requires dvclive")(test_case)


def require_swanlab(test_case: T) -> T:
    """Skip the decorated test unless this machine has swanlab.

    Args:
        test_case (T): The test function or TestCase class.

    Returns:
        T: The test, skipped where the condition does not hold.
    """
    return unittest.skipUnless(is_swanlab_available(), "test requires swanlab")(test_case)


def require_pandas(test_case: T) -> T:
    """Skip the decorated test unless this machine has pandas.

    Args:
        test_case (T): The test function or TestCase class.

    Returns:
        T: The test, skipped where the condition does not hold.
    """
    return unittest.skipUnless(is_pandas_available(), "test requires pandas")(test_case)


def require_mlflow(test_case: T) -> T:
    """Skip the decorated test unless this machine has mlflow.

    Args:
        test_case (T): The test function or TestCase class.

    Returns:
        T: The test, skipped where the condition does not hold.
    """
    return unittest.skipUnless(is_mlflow_available(), "test requires mlflow")(test_case)


def require_pippy(test_case: T) -> T:
    """Skip the decorated test unless this machine has pippy.

    Args:
        test_case (T): The test function or TestCase class.

    Returns:
        T: The test, skipped where the condition does not hold.
    """
    return unittest.skipUnless(is_pippy_available(), "test requires pippy")(test_case)


def require_import_timer(test_case: T) -> T:
    """Skip the decorated test unless this machine has import_timer.

    Args:
        test_case (T): The test function or TestCase class.

    Returns:
        T: The test, skipped where the condition does not hold.
    """
    return unittest.skipUnless(is_import_timer_available(), "test requires import_timer")(test_case)


def require_transformer_engine(test_case: T) -> T:
    """Skip the decorated test unless this machine has transformers engine.

    Args:
        test_case (T): The test function or TestCase class.

    Returns:
        T: The test, skipped where the condition does not hold.
    """
    return unittest.skipUnless(
        is_transformer_engine_available(), "test requires transformers engine"
    )(test_case)


def require_transformer_engine_mxfp8(test_case: T) -> T:
    """Skip the decorated test unless this machine has transformers engine MXFP8 block scaling.

    Args:
        test_case (T): The test function or TestCase class.

    Returns:
        T: The test, skipped where the condition does not hold.
    """
    return unittest.skipUnless(
        is_transformer_engine_mxfp8_available(),
        "test requires transformers engine MXFP8 block scaling",
    )(test_case)


def require_torchao(test_case: T) -> T:
    """Skip the decorated test unless this machine has torchao.

    Args:
        test_case (T): The test function or TestCase class.

    Returns:
        T: The test, skipped where the condition does not hold.
    """
    return unittest.skipUnless(is_torchao_available(), "test requires torchao")(test_case)


def require_matplotlib(test_case: T) -> T:
    """Skip the decorated test unless this machine has matplotlib.

    Args:
        test_case (T): The test function or TestCase class.

    Returns:
        T: The test, skipped where the condition does not hold.
    """
    return unittest.skipUnless(is_matplotlib_available(), "test requires matplotlib")(test_case)


def require_trackers(test_case: T) -> T:
    """Skip the decorated test unless this machine has at least one tracker to be available and for `comet_ml` to not be installed.

    Args:
        test_case (T): The test function or TestCase class.

    Returns:
        T: The test, skipped where the condition does not hold.
    """
    return unittest.skipUnless(
        _at_least_one_tracker,
        "test requires at least one tracker to be available and for `comet_ml` to not be installed",
    )(test_case)


def require_torchdata_stateful_dataloader(test_case: T) -> T:
    """Skip the decorated test unless this machine has torchdata.stateful_dataloader.

    Args:
        test_case (T): The test function or TestCase class.

    Returns:
        T: The test, skipped where the condition does not hold.
    """
    return unittest.skipUnless(
        is_torchdata_stateful_dataloader_available(), "test requires torchdata.stateful_dataloader"
    )(test_case)


def run_first(test_case: T) -> T:
    """Mark the test to run first when pytest-order is installed (`pytest.mark.order(1)`).

    Args:
        test_case (T): The test function or TestCase class.

    Returns:
        T: The marked test (unchanged without pytest).
    """
    if is_pytest_available():
        import pytest  # optional dependency

        return pytest.mark.order(1)(test_case)
    return test_case


class TempDirTestCase(unittest.TestCase):
    """A TestCase with one temporary folder (`self.tmpdir`, a Path) for the whole class, emptied
    before each test when `clear_on_setup` is True and removed after the last test."""

    clear_on_setup = True
    tmpdir: Path

    @classmethod
    def setUpClass(cls) -> None:
        """Create the temporary directory shared by the tests of the class."""
        cls.tmpdir = Path(tempfile.mkdtemp())

    @classmethod
    def tearDownClass(cls) -> None:
        """Delete the class's temporary directory."""
        shutil.rmtree(cls.tmpdir, ignore_errors=True)

    def setUp(self) -> None:
        """Empty the temporary directory before each test when `clear_on_setup` is set."""
        if self.clear_on_setup:
            for path in self.tmpdir.iterdir():
                if path.is_dir():
                    shutil.rmtree(path)
                else:
                    path.unlink()


class AccelerateTestCase(unittest.TestCase):
    """A TestCase that resets Cadence's process-wide state (`AcceleratorState`, `GradientState`)
    after every test, so tests do not leak settings into each other."""

    def tearDown(self) -> None:
        """Reset the shared accelerator and gradient states after each test."""
        super().tearDown()

        AcceleratorState._reset_state(True)
        GradientState._reset_state()


# The package's own name for the same base class.
CadenceTestCase = AccelerateTestCase


class MockingTestCase(unittest.TestCase):
    """A TestCase that starts mocks created in `setUp` (after `super().setUp()`) and stops them
    after each test: call `self.add_mocks(mock.patch.dict(os.environ, {...}))`."""

    def add_mocks(self, mocks: Any) -> None:
        """Start `mocks` (one patcher or a list) now and stop them when the test ends.

        Args:
            mocks (Any): A `unittest.mock.patch` patcher, or a list or tuple of them.
        """
        self.mocks = list(mocks) if isinstance(mocks, (tuple, list)) else [mocks]
        for patcher in self.mocks:
            patcher.start()
            self.addCleanup(patcher.stop)


def are_the_same_tensors(tensor: torch.Tensor) -> bool:
    """Whether every process holds the same `tensor` (gathers it; collective).

    Args:
        tensor (torch.Tensor): This process's tensor (same shape on every process).

    Returns:
        bool: True when every process's copy equals this one.
    """

    local = tensor[None].clone().to(AcceleratorState().device)
    everyone = gather(local).cpu()
    return all(torch.equal(row, local[0].cpu()) for row in everyone)


# Keep pytest from collecting helpers whose names start with "test".
__test__ = False
