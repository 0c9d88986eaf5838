"""`cadence launch --tpu` and a config file with `distributed_type: XLA`, through a real `cadence launch`
subprocess that runs the script's main function with torch_xla's launcher (on its CPU device here).
Run by `make test-xla`; skipped without torch_xla."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

if importlib.util.find_spec("torch_xla") is None:
    pytest.skip(
        "torch_xla is not installed (`make test-xla` builds .venv-xla with it)",
        allow_module_level=True,
    )

from xla_runner import MARK, SCRIPTS  # noqa: E402

pytestmark = pytest.mark.xla

CADENCE = [sys.executable, "-m", "cadence.commands.cli"]
SCRIPT = str(SCRIPTS / "xla_launched.py")


def launch(*args: str, cwd: Path) -> tuple[dict, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PJRT_DEVICE", "CADENCE_USE_XLA")}
    env["HOME"] = str(cwd)  # no default config file of the machine
    proc = subprocess.run(
        [*CADENCE, "launch", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith(MARK)]
    assert proc.returncode == 0 and lines, (
        proc.returncode,
        proc.stdout[-3000:],
        proc.stderr[-5000:],
    )
    return json.loads(lines[-1][len(MARK) :]), proc.stdout + proc.stderr


def test_launch_tpu_runs_main_under_torch_xla_with_the_launch_settings(tmp_path):
    result, output = launch(
        "--tpu", "--mixed_precision", "bf16", "--gradient_accumulation_steps", "2",
        SCRIPT, "--lr", "3", cwd=tmp_path,
    )  # fmt: skip
    assert result["distributed_type"] == "XLA"
    assert result["device_type"] == "xla"
    assert result["num_processes"] == 1
    assert result["mixed_precision"] == "bf16"
    assert result["gradient_accumulation_steps"] == 2
    assert result["argv"] == ["--lr", "3"]  # the script's own arguments
    assert result["fork_launched"] == "1"
    assert len(result["losses"]) == 16 and all(loss == loss for loss in result["losses"])
    assert "PJRT_DEVICE=CPU" in output  # no TPU here: torch_xla's CPU device, said in the banner
    assert "printed by the main process" in output  # local process 0 prints (the reference: -1)


def test_config_file_with_distributed_type_xla_launches_through_torch_xla(tmp_path):
    config = tmp_path / "xla.yaml"
    config.write_text(
        "compute_environment: LOCAL_MACHINE\ndistributed_type: XLA\nmixed_precision: 'no'\n"
        "num_processes: 1\nmain_training_function: main\n"
    )
    result, _ = launch("--config_file", str(config), SCRIPT, cwd=tmp_path)
    assert result["distributed_type"] == "XLA"
    assert result["mixed_precision"] == "no"
    assert result["argv"] == []


def test_dry_run_shows_the_xla_worker_command_and_starts_nothing(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "PJRT_DEVICE"}
    proc = subprocess.run(
        [*CADENCE, "launch", "--dry_run", "--tpu", "--main_training_function", "train", SCRIPT],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "worker command:" in proc.stdout
    assert "cadence.launch.xla_worker --function train" in proc.stdout
    assert MARK not in proc.stdout


def test_notebook_launcher_forks_the_function_onto_xla():
    from xla_runner import run_scenario

    report = run_scenario("xla_notebook")
    child = report["child"]
    assert child["pid"] != report["parent_pid"]  # forked by torch_xla's launcher
    assert child["distributed_type"] == "XLA"
    assert child["device_type"] == "xla"
    assert child["mixed_precision"] == "bf16"
    assert len(child["losses"]) == 16 and all(loss == loss for loss in child["losses"])
    # An Accelerator made in the notebook itself is refused with the reference's message.
    assert (
        "the `Accelerator` should only be initialized inside your training function"
        in (report["after_accelerator"])
    )
