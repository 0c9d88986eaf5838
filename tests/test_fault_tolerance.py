"""Per-step fault tolerance on torchft (issue 36): real `cadence launch --fault_tolerance` runs on
loopback, each bounded by a subprocess timeout; assertions on counts, steps and weights only."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).parent / "ft_scripts" / "ft_train.py"
SRC = Path(__file__).resolve().parents[1] / "src"


def _env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(SRC), env.get("PYTHONPATH", "")])
    env.update(extra)
    return env


def _launch(
    out: Path, *flags: str, timeout: int = 240, **knobs: str
) -> subprocess.CompletedProcess:
    argv = [sys.executable, "-m", "cadence.commands.cli", "launch", "--cpu", *flags, str(SCRIPT)]
    return subprocess.run(
        argv, env=_env(FT_OUT=str(out), **knobs), capture_output=True, text=True, timeout=timeout
    )


def _ledger(out: Path, group: int) -> list[dict]:
    path = out / f"ledger.{group}.0.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _weights(out: Path, group: int) -> list[float]:
    return json.loads((out / f"weights.{group}.0.json").read_text())["weights"]


def _committed_ids(out: Path, groups: int) -> list[int]:
    return sorted(
        i for g in range(groups) for r in _ledger(out, g) if r["committed"] for i in r["ids"]
    )


def _check_run(result: subprocess.CompletedProcess, out: Path, samples: int) -> None:
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    # Every sample of the epoch trained exactly once, across the kill and the heal.
    assert _committed_ids(out, 2) == list(range(samples))
    # The survivor never restarted; the killed group came back as a second incarnation.
    assert {r["incarnation"] for r in _ledger(out, 0)} == {0}
    assert {r["incarnation"] for r in _ledger(out, 1)} == {0, 1}
    # After the heal both groups hold the same weights.
    assert _weights(out, 0) == _weights(out, 1)


def test_group_killed_between_steps_survivor_continues_and_heal_matches(tmp_path: Path) -> None:
    pytest.importorskip("torchft")
    samples = 96
    result = _launch(
        tmp_path, "--fault_tolerance", "--replica_groups", "2", "--nproc_per_node", "1",
        FT_SAMPLES=str(samples), FT_KILL_GROUP="1", FT_KILL_AT="4", FT_SLOW_ALONE="1.0",
    )  # fmt: skip
    _check_run(result, tmp_path, samples)
    survivor = _ledger(tmp_path, 0)
    assert sum(not r["committed"] for r in survivor) <= 1  # at most one step discarded
    assert any(r["participants"] == 1 and r["committed"] for r in survivor)  # trained alone
    text = result.stdout + result.stderr
    assert "replica group 1 lost at step" in text and "1 of 2 groups training" in text
    assert "group 1 healed from group 0 at step" in text
    # The scheduler followed committed steps only: the same learning rate on both at the end.
    assert survivor[-1]["lr"] == _ledger(tmp_path, 1)[-1]["lr"]


def test_min_replicas_above_survivors_waits_then_resumes(tmp_path: Path) -> None:
    pytest.importorskip("torchft")
    samples = 32
    result = _launch(
        tmp_path, "--fault_tolerance", "--replica_groups", "2", "--min_replicas", "2",
        FT_SAMPLES=str(samples), FT_KILL_GROUP="1", FT_KILL_AT="3", FT_RESTART_DELAY="6",
    )  # fmt: skip
    _check_run(result, tmp_path, samples)
    survivor = _ledger(tmp_path, 0)
    # No step ever committed with fewer than two groups.
    assert all(r["participants"] == 2 for r in survivor if r["committed"])
    assert "waits for a quorum" in result.stdout + result.stderr
    assert "min_replicas=2" in result.stdout + result.stderr


def test_fault_tolerance_without_torchft_is_a_clear_error(tmp_path: Path) -> None:
    code = (
        "import sys; sys.modules['torchft'] = None\n"
        "from cadence.commands.cli import main\n"
        f"sys.exit(main(['launch', '--cpu', '--fault_tolerance', '--replica_groups', '2', {str(SCRIPT)!r}]))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], env=_env(FT_OUT=str(tmp_path)), capture_output=True,
        text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 2
    assert "--fault_tolerance needs torchft, which is not installed" in result.stderr
    assert "pip install 'cadence[ft]'" in result.stderr
    assert not list(tmp_path.iterdir())  # nothing started


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--fault_tolerance"], "--fault_tolerance needs --replica_groups G"),
        (["--fault_tolerance", "--replica_group", "1"], "pass --lighthouse HOST:PORT too"),
        (["--fault_tolerance", "--lighthouse", "127.0.0.1:1"], "--lighthouse needs --replica_group"),
        (["--replica_groups", "2"], "need --fault_tolerance"),
        (["--fault_tolerance", "--replica_groups", "2", "--min_replicas", "3"], "no step could ever commit"),
        (["--fault_tolerance", "--replica_groups", "2", "--heartbeat_timeout", "0"], "heartbeat_timeout must be more than 0"),
    ],
)  # fmt: skip
def test_bad_fault_tolerance_flags_are_refused_before_start(
    tmp_path: Path, flags: list[str], message: str
) -> None:
    pytest.importorskip("torchft")
    result = _launch(tmp_path, *flags, timeout=60)
    assert result.returncode == 2, result.stderr
    assert message in result.stderr and "Nothing was started" in result.stderr


def test_fault_tolerance_config_in_code_is_checked() -> None:
    from cadence.fault_tolerance import FaultToleranceConfig

    with pytest.raises(ValueError, match="lighthouse is required"):
        FaultToleranceConfig()
    with pytest.raises(ValueError, match="replica_group must be in 0..1"):
        FaultToleranceConfig(lighthouse="http://127.0.0.1:1", replica_group=2, replica_groups=2)
    config = FaultToleranceConfig(lighthouse="http://127.0.0.1:1", replica_groups=2)
    assert FaultToleranceConfig.from_record(config.to_record()) == config
