"""Testing helpers for projects built on Cadence: skip decorators that answer truthfully for this
machine, test-case bases that reset state or keep a temporary folder, subprocess runners and the
launch command of the bundled test scripts. The skip decorators live in `device_requirements` (the
machine) and `package_requirements` (optional packages), and are re-exported here.

Importing this module (not `import cadence`) inspects the hardware once: `torch_device`,
`device_count` and `memory_allocated_func` describe this machine.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import unittest
from pathlib import Path
from typing import Any, TypeVar

import torch

from ..core.availability import is_pytest_available
from ..core.environment import str_to_bool
from ..runtime.collectives import gather
from ..runtime.state import AcceleratorState, GradientState
from . import device_requirements, package_requirements
from .device_requirements import device_count as device_count
from .device_requirements import get_backend as get_backend
from .device_requirements import memory_allocated_func as memory_allocated_func
from .device_requirements import require_cpu as require_cpu
from .device_requirements import require_cuda as require_cuda
from .device_requirements import require_cuda_or_hpu as require_cuda_or_hpu
from .device_requirements import require_cuda_or_xpu as require_cuda_or_xpu
from .device_requirements import require_fp8 as require_fp8
from .device_requirements import require_fp16 as require_fp16
from .device_requirements import require_fsdp2 as require_fsdp2
from .device_requirements import require_mlu as require_mlu
from .device_requirements import require_mps as require_mps
from .device_requirements import require_multi_device as require_multi_device
from .device_requirements import require_multi_gpu as require_multi_gpu
from .device_requirements import require_multi_gpu_or_xpu as require_multi_gpu_or_xpu
from .device_requirements import require_multi_xpu as require_multi_xpu
from .device_requirements import require_musa as require_musa
from .device_requirements import require_neuron as require_neuron
from .device_requirements import require_non_cpu as require_non_cpu
from .device_requirements import require_non_hpu as require_non_hpu
from .device_requirements import require_non_torch_xla as require_non_torch_xla
from .device_requirements import require_non_xpu as require_non_xpu
from .device_requirements import require_npu as require_npu
from .device_requirements import require_sdaa as require_sdaa
from .device_requirements import require_single_device as require_single_device
from .device_requirements import require_single_gpu as require_single_gpu
from .device_requirements import require_single_xpu as require_single_xpu
from .device_requirements import require_torch_min_version as require_torch_min_version
from .device_requirements import require_tp as require_tp
from .device_requirements import require_tpu as require_tpu
from .device_requirements import require_xpu as require_xpu
from .device_requirements import torch_device as torch_device
from .package_requirements import require_aim as require_aim
from .package_requirements import require_bnb as require_bnb
from .package_requirements import require_clearml as require_clearml
from .package_requirements import require_comet_ml as require_comet_ml
from .package_requirements import require_datasets as require_datasets
from .package_requirements import require_deepspeed as require_deepspeed
from .package_requirements import require_dvclive as require_dvclive
from .package_requirements import require_huggingface_suite as require_huggingface_suite
from .package_requirements import require_import_timer as require_import_timer
from .package_requirements import require_matplotlib as require_matplotlib
from .package_requirements import require_mlflow as require_mlflow
from .package_requirements import require_pandas as require_pandas
from .package_requirements import require_peft as require_peft
from .package_requirements import require_pippy as require_pippy
from .package_requirements import require_schedulefree as require_schedulefree
from .package_requirements import require_swanlab as require_swanlab
from .package_requirements import require_tensorboard as require_tensorboard
from .package_requirements import require_timm as require_timm
from .package_requirements import require_torchao as require_torchao
from .package_requirements import (
    require_torchdata_stateful_dataloader as require_torchdata_stateful_dataloader,
)
from .package_requirements import require_torchvision as require_torchvision
from .package_requirements import require_trackers as require_trackers
from .package_requirements import require_trackio as require_trackio
from .package_requirements import require_transformer_engine as require_transformer_engine
from .package_requirements import (
    require_transformer_engine_mxfp8 as require_transformer_engine_mxfp8,
)
from .package_requirements import require_transformers as require_transformers
from .package_requirements import require_triton as require_triton
from .package_requirements import require_wandb as require_wandb
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


def __getattr__(name: str) -> Any:
    """Names this module imported before the skip decorators moved out (the availability checks,
    `is_torch_version`, ...): still reachable here, as code written against Accelerate's `testing`
    module may import them from it."""
    for module in (device_requirements, package_requirements):
        if hasattr(module, name):
            return getattr(module, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
