"""`cadence launch --tpu` refuses what it cannot do with one clear message, before starting anything:
multi-host pod flags, conflicting paradigms, fp16, a missing torch_xla (real `cadence` subprocesses)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

import pytest

CADENCE = [sys.executable, "-m", "cadence.commands.cli"]


def refuse(tmp_path, *args: str) -> str:
    script = tmp_path / "train.py"
    script.write_text("def main():\n    open('started.marker', 'w').close()\n")
    env = {k: v for k, v in os.environ.items() if k != "PJRT_DEVICE"}
    env["HOME"] = str(tmp_path)
    proc = subprocess.run(
        [*CADENCE, "launch", *args, str(script)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr
    assert "Nothing was started" in proc.stderr
    assert not (tmp_path / "started.marker").exists()
    return proc.stderr


def test_pod_flags_say_what_is_supported(tmp_path):
    err = refuse(tmp_path, "--tpu", "--tpu_cluster", "--vm", "host-1", "--tpu_use_sudo")
    assert "--tpu_cluster, --tpu_use_sudo, --vm" in err
    assert "multi-host TPU pod is not supported" in err
    assert "run that same command on every host" in err


def test_tpu_with_another_paradigm_and_fp16_are_refused_together(tmp_path):
    err = refuse(tmp_path, "--tpu", "--multi_gpu", "--mixed_precision", "fp16")
    assert "--tpu and --multi_gpu cannot be used together" in err
    assert "mixed_precision='fp16' is not supported on XLA devices" in err


def test_xla_config_file_with_cpu_flag_is_refused(tmp_path):
    config = tmp_path / "xla.yaml"
    config.write_text("compute_environment: LOCAL_MACHINE\ndistributed_type: XLA\n")
    err = refuse(tmp_path, "--config_file", str(config), "--cpu")
    assert "distributed_type XLA" in err and "drop that flag" in err


@pytest.mark.skipif(importlib.util.find_spec("torch_xla") is not None, reason="torch_xla is here")
def test_tpu_without_torch_xla_says_how_to_install_it(tmp_path):
    err = refuse(tmp_path, "--tpu")
    assert "--tpu needs torch_xla, which is not installed" in err
    assert "pip install torch-xla" in err
