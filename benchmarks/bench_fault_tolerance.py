"""Fault tolerance (torchft) on this machine: a healthy step with and without it, the time from a
group's death to the survivor's next commit, and the time for the restarted group to heal.

    PYTHONPATH=src python benchmarks/bench_fault_tolerance.py

Runs tests/ft_scripts/ft_train.py (a tiny linear model, batch 2) through `cadence launch`: two
replica groups of one process each, healthy and with group 1 SIGKILLed at its 5th step; and the same
script's step on two plain DDP processes is not comparable (it needs the FT record), so the healthy
baseline is one group alone (no cross-group average: the Manager's quorum and vote only).
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "tests" / "ft_scripts" / "ft_train.py"


def run(out: Path, groups: int, **knobs: str) -> None:
    argv = [sys.executable, "-m", "cadence.commands.cli", "launch", "--cpu", "--fault_tolerance",
            "--replica_groups", str(groups), str(SCRIPT)]  # fmt: skip
    env = {**__import__("os").environ, "FT_OUT": str(out), **knobs}
    subprocess.run(argv, env=env, check=True, capture_output=True, timeout=600)


def ledger(out: Path, group: int) -> list[dict]:
    lines = (out / f"ledger.{group}.0.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines if line.strip()]


def step_ms(rows: list[dict]) -> float:
    both = [
        b["t"] - a["t"] for a, b in zip(rows, rows[1:]) if a["participants"] == b["participants"]
    ]
    return 1000 * statistics.median(both)


def main() -> None:
    with tempfile.TemporaryDirectory() as folder:
        one, two, kill = (Path(folder) / name for name in ("one", "two", "kill"))
        for path in (one, two, kill):
            path.mkdir()
        run(one, 1, FT_SAMPLES="256")
        run(two, 2, FT_SAMPLES="512")
        run(kill, 2, FT_SAMPLES="256", FT_KILL_GROUP="1", FT_KILL_AT="5", FT_SLOW_ALONE="1.0")
        healthy_two = [r for r in ledger(two, 0) if r["participants"] == 2]
        print(f"step, 1 group (quorum + vote, no peer): {step_ms(ledger(one, 0)):.1f} ms")
        print(f"step, 2 groups (quorum + average + vote): {step_ms(healthy_two):.1f} ms")
        killed_at = float((kill / "killed_at").read_text())
        survivor = [r for r in ledger(kill, 0) if r["committed"] and r["t"] > killed_at]
        print(f"death to the survivor's next commit: {survivor[0]['t'] - killed_at:.2f} s")
        restarted = float((kill / "restarted.1").read_text())
        healed = [r for r in ledger(kill, 1) if r["incarnation"] == 1]
        print(
            f"restarted worker's start to its first committed step: {healed[0]['t'] - restarted:.2f} s"
        )
        print(
            f"death to restarted worker's start (agent + interpreter): {restarted - killed_at:.2f} s"
        )


if __name__ == "__main__":
    main()
