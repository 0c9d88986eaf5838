"""GPU questions answered without a CUDA context (what notebook_launcher's fork needs)."""

from __future__ import annotations

import os
import subprocess
import sys

import torch

from cadence.runtime.cuda_probe import NVML_CHECK_ENV, cuda_device_count, nvml_based_cuda_check


def test_the_nvml_switch_is_restored(monkeypatch):
    monkeypatch.delenv(NVML_CHECK_ENV, raising=False)
    with nvml_based_cuda_check():
        assert os.environ[NVML_CHECK_ENV] == "1"
    assert NVML_CHECK_ENV not in os.environ
    monkeypatch.setenv(NVML_CHECK_ENV, "0")
    with nvml_based_cuda_check():
        assert os.environ[NVML_CHECK_ENV] == "1"
    assert os.environ[NVML_CHECK_ENV] == "0"


def test_counting_gpus_creates_no_cuda_context():
    """In a fresh process (on a GPU machine this is the real check; without one the count is 0)."""
    code = (
        "import torch\n"
        "from cadence.runtime.cuda_probe import cuda_device_count\n"
        "from cadence.runtime.hardware import visible_gpu_count\n"
        "print(cuda_device_count(), visible_gpu_count(), torch.cuda.is_initialized())\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    count, visible, initialised = done.stdout.split()
    assert initialised == "False"
    expected = torch.cuda.device_count() if torch.cuda.is_available() else 0
    assert int(count) == expected
    assert int(visible) == (0 if os.environ.get("CUDA_VISIBLE_DEVICES") == "" else expected)
    assert cuda_device_count() == expected
