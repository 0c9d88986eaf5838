"""`cadence env`, the command list, and the promise that help and env start without importing torch."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
import textwrap
from importlib import metadata
from pathlib import Path

import pytest

from cadence.runtime import hardware

CADENCE = [sys.executable, "-m", "cadence.commands.cli"]


def clean_env(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("CADENCE_")}
    env["HF_HOME"] = str(tmp_path / "hf")
    return env


def test_env_reports_versions_and_config(tmp_path):
    config = tmp_path / "hf" / "cadence" / "default_config.yaml"
    config.parent.mkdir(parents=True)
    config.write_text(
        "compute_environment: LOCAL_MACHINE\ndistributed_type: MULTI_CPU\nnum_processes: 6\n"
    )
    result = subprocess.run(
        [*CADENCE, "env"], env=clean_env(tmp_path), capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert f"- `Cadence` version: {metadata.version('cadence')}" in out
    assert f"- Python version: {platform.python_version()}" in out
    assert f"- PyTorch version: {metadata.version('torch')}" in out
    assert "- CPU:" in out and "- Platform:" in out
    assert "\t- num_processes: 6" in out and "\t- distributed_type: MULTI_CPU" in out


def test_env_without_config_file_says_so(tmp_path):
    result = subprocess.run(
        [*CADENCE, "env"], env=clean_env(tmp_path), capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0
    assert "- `Cadence` default config:\n\tNot found" in result.stdout


def test_console_script_is_installed():
    script = Path(sys.executable).parent / "cadence"
    result = subprocess.run([str(script), "--help"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0
    for command in ("config", "env", "launch"):
        assert command in result.stdout


def test_no_command_prints_help_and_fails():
    result = subprocess.run(CADENCE, capture_output=True, text=True, timeout=60)
    assert result.returncode == 1 and "usage: cadence" in result.stdout


def _imports_torch(argv: list[str], tmp_path) -> bool:
    probe = textwrap.dedent(
        f"""
        import sys
        from cadence.commands.cli import main
        try:
            main({argv!r})
        except SystemExit:
            pass
        sys.__stdout__.write("TORCH_LOADED=" + str("torch" in sys.modules) + "\\n")
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", probe],
        env=clean_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert "TORCH_LOADED=" in result.stdout, result.stderr
    return "TORCH_LOADED=True" in result.stdout


@pytest.mark.parametrize(
    "argv",
    [["--help"], ["config", "--help"], ["launch", "--help"], ["config", "default", "--help"]],
)
def test_help_does_not_import_torch(argv, tmp_path):
    assert not _imports_torch(argv, tmp_path)


def test_env_and_dry_run_do_not_import_torch_without_a_gpu_driver(tmp_path):
    if hardware._gpu_driver_present():
        pytest.skip("a GPU driver is present: counting GPUs needs torch here")
    (tmp_path / "t.py").write_text("")
    assert not _imports_torch(["env"], tmp_path)
    assert not _imports_torch(
        ["launch", "--dry_run", "--num_processes", "2", str(tmp_path / "t.py")], tmp_path
    )
