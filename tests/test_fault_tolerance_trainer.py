"""transformers' Trainer through the `accelerate` alias under `--fault_tolerance` (issue 43): a group
killed in a later epoch comes back, passes through the epochs the job finished (one stand-in batch
each, which trains nothing, so Trainer's loop does not stop), replays the job's evaluations of them,
heals the learning-rate schedule Trainer keeps outside `prepare`, and ends with the job."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

pytest.importorskip("transformers")
pytest.importorskip("torchft")

SCRIPT = Path(__file__).parent / "ft_scripts" / "ft_trainer_train.py"
SRC = Path(__file__).resolve().parents[1] / "src"


def _launch(out: Path, **env: str) -> subprocess.CompletedProcess:
    argv = [
        sys.executable, "-m", "cadence.commands.cli", "launch", "--cpu", "--fault_tolerance",
        "--replica_groups", "2", "--nproc_per_node", "1", "--as_accelerate", str(SCRIPT), str(out),
    ]  # fmt: skip
    full = {k: v for k, v in os.environ.items() if not k.startswith(("CADENCE_", "TORCHFT_"))}
    full.update(env, PYTHONPATH=os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")]))
    full.update(TRANSFORMERS_VERBOSITY="error")
    return subprocess.run(argv, env=full, capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("seed", [0, 4])
def test_a_trainer_group_killed_in_a_later_epoch_ends_with_the_job(tmp_path, seed):
    """48 samples, 4 per micro-batch: with accumulation 1, 6 optimizer steps an epoch with both
    groups, 12 alone (half as many with accumulation 2); group 1 killed at an optimizer step drawn
    from the printed seed (any of the first three epochs of 4; seed 0: accumulation 2, epoch 2;
    seed 4: accumulation 1, epoch 1) comes back while group 0 trains on."""
    rng = random.Random(seed)
    accum = rng.choice((1, 2))
    kill_at = rng.randint(1, 18 // accum)
    print(f"seed {seed}: accumulation {accum}, group 1 killed at its optimizer step {kill_at}")
    epochs, samples = 4, 48
    result = _launch(
        tmp_path, KILL_GROUP="1", KILL_AT=str(kill_at), STEP_SLEEP="0.3", EPOCHS=str(epochs),
        SAMPLES=str(samples), ACCUM=str(accum),
    )  # fmt: skip
    text = result.stdout + result.stderr
    assert result.returncode == 0, text[-6000:]
    assert "replica group 1 lost" in text and "group 1 healed from group 0" in text, text[-4000:]
    finals = {g: json.loads((tmp_path / f"result.{g}.0.json").read_text()) for g in (0, 1)}
    assert finals[1]["inc"] >= 1  # the result is the restarted script's
    # The same weights, and every evaluation of the job seen by both groups (replayed, for the
    # epochs the restarted group passed through), one per epoch.
    assert finals[0]["weights"] == finals[1]["weights"]
    assert len(finals[0]["evals"]) == epochs
    assert finals[1]["evals"] == finals[0]["evals"]
    # Over the committed steps of both groups, every sample trained once per epoch.
    counts: Counter = Counter()
    for group in (0, 1):
        for line in (tmp_path / f"steps.{group}.0.jsonl").read_text().splitlines():
            counts.update(json.loads(line)["ids"])
    assert counts == Counter({i: epochs for i in range(samples)}), counts
