"""Run an XLA scenario script (tests/xla/scripts) in its own process on torch_xla's CPU device and
return its JSON report. Importing torch_xla costs seconds, so each script checks many things at once."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

SCRIPTS = Path(__file__).parent / "scripts"
MARK = "XLA-RESULT "


def run_scenario(name: str, timeout: float = 540, **env: str) -> dict:
    """Run scripts/`name`.py with PJRT_DEVICE=CPU (plus `env`) and return its report."""
    full_env = {**os.environ, "PJRT_DEVICE": "CPU", **env}
    full_env.pop("CADENCE_USE_XLA", None)
    proc = subprocess.run(
        [sys.executable, str(SCRIPTS / f"{name}.py")],
        env=full_env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith(MARK)]
    if proc.returncode != 0 or not lines:
        raise AssertionError(
            f"{name} failed (exit {proc.returncode}):\n{proc.stdout[-4000:]}\n{proc.stderr[-6000:]}"
        )
    return json.loads(lines[-1][len(MARK) :])
