"""Several XLA replicas (one process per TPU chip, started by `cadence launch --tpu`): collectives and
data-parallel training. torch_xla's CPU device cannot run several replicas (each process sees a world of
one), so these need a real TPU VM and are skipped elsewhere; nothing here is simulated."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import pytest

from cadence.xla import runtime as xla_runtime

pytestmark = [
    pytest.mark.xla,
    pytest.mark.tpu,
    pytest.mark.skipif(
        importlib.util.find_spec("torch_xla") is None or not xla_runtime.tpu_present(),
        reason="needs a TPU VM with torch_xla (several XLA replicas cannot run on torch_xla's CPU device)",
    ),
]

SCRIPT = os.path.join(os.path.dirname(__file__), "scripts", "xla_replicas.py")
MARK = "XLA-RESULT "


@pytest.fixture(scope="module")
def reports() -> list[dict]:
    env = {k: v for k, v in os.environ.items() if k != "PJRT_DEVICE"}
    proc = subprocess.run(
        [sys.executable, "-m", "cadence.commands.cli", "launch", "--tpu", SCRIPT],
        env=env, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-5000:]
    found = [
        json.loads(line[len(MARK) :]) for line in proc.stdout.splitlines() if line.startswith(MARK)
    ]
    return sorted(found, key=lambda report: report["rank"])


def test_every_replica_reports(reports):
    n = reports[0]["num_processes"]
    assert n > 1
    assert [report["rank"] for report in reports] == list(range(n))
    assert all(report["distributed_type"] == "XLA" for report in reports)


def test_collectives_between_replicas(reports):
    n = len(reports)
    ranks = [float(r) for r in range(n)]
    for report in reports:
        assert report["gather"] == ranks
        assert report["gather_0d"] == ranks
        assert report["reduce_sum_scale"] == [sum(ranks) * 0.5]
        assert report["reduce_mean"] == [sum(ranks) / n]
        assert report["reduce_max"] == [float(n - 1)]
        assert report["broadcast"] == [float(n - 1)]
        assert report["gather_object"] == [{"rank": r} for r in range(n)]
        assert report["broadcast_object_list"] == ["from 0"]
        assert report["pad_shape"] == [n]


def test_data_parallel_training_matches_eager_cpu_on_the_global_batch(reports):
    for report in reports:
        assert report["weights_max_abs_diff"] < 1e-4  # TPU matmuls round differently from the CPU
