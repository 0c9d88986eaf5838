"""Helpers of the `accelerate` alias tests: the environment of a subprocess with the alias on, no
network and private Hugging Face folders, and the runner of the case scripts in compat/cases."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

CASES = Path(__file__).resolve().parents[1] / "compat" / "cases"
CADENCE = [sys.executable, "-m", "cadence.commands.cli"]


def alias_env(tmp_path: Path, alias: bool = True) -> dict[str, str]:
    """This environment less launch variables, with the alias on (or off), offline, HF_HOME in tmp."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("CADENCE_", "TORCHELASTIC_", "PET_"))
        and k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
    }
    env.update(
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        HF_DATASETS_OFFLINE="1",
        HF_HOME=str(tmp_path / "hf"),
        CUDA_VISIBLE_DEVICES="",  # CPU runs (gloo), also on a GPU machine
        OMP_NUM_THREADS="1",
        TOKENIZERS_PARALLELISM="false",
    )
    if alias:
        env["CADENCE_AS_ACCELERATE"] = "1"
    return env


def result_of(completed: subprocess.CompletedProcess) -> dict:
    """The `RESULT {...}` line a case script printed (fails with the output when there is none)."""
    for line in completed.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT ") :])
    raise AssertionError(
        f"no RESULT line (exit {completed.returncode})\nstdout:\n{completed.stdout[-3000:]}\n"
        f"stderr:\n{completed.stderr[-6000:]}"
    )


def run_case(
    tmp_path: Path, script: str, launcher: list[str] | None = None, timeout: float = 540
) -> dict:
    """Run compat/cases/`script` (under `launcher`, e.g. `cadence launch ...`) with the alias on."""
    out = tmp_path / Path(script).stem
    out.mkdir(parents=True, exist_ok=True)
    command = [*(launcher or [sys.executable]), str(CASES / script), str(out)]
    completed = subprocess.run(
        command,
        cwd=tmp_path,
        env=alias_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    return result_of(completed)


def run_python(tmp_path: Path, code: str, alias: bool = True, timeout: float = 180) -> dict:
    """Run `code` (which prints a RESULT line) in a fresh interpreter."""
    completed = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        env=alias_env(tmp_path, alias),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    return result_of(completed)


def needs(*names: str) -> None:
    """Skip unless these packages are installed. They are only looked up, not imported: peft, TRL and
    diffusers import `accelerate` themselves, which exists only with the alias on (in the case's
    subprocess), not in the test process."""
    import importlib.util

    import pytest

    missing = [name for name in names if importlib.util.find_spec(name) is None]
    if missing:
        pytest.skip(f"needs {', '.join(missing)} (the test extra installs them)")
