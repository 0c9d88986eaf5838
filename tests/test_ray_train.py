"""Cadence under Ray Train with a real local Ray cluster (issue 27): TorchTrainer workers training
with Accelerator(cpu=True) end where `cadence launch` ends; checkpoints reported per worker (each
rank's own folder, merged by Ray) resume bit-identical to the uninterrupted run, from a copy of the stopped run.

One cluster for the module (2 CPUs, loopback, no dashboard), shut down at the end; skipped when
Ray Train is not installed.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ray = pytest.importorskip("ray")
pytest.importorskip("ray.train.torch")

TESTS = Path(__file__).resolve().parent
SRC = TESTS.parent / "src"
CADENCE = [sys.executable, "-m", "cadence.commands.cli"]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    paths = [str(TESTS), str(SRC), os.environ.get("PYTHONPATH", "")]
    env = {
        "PYTHONPATH": os.pathsep.join(p for p in paths if p),
        "CUDA_VISIBLE_DEVICES": "",
        "OMP_NUM_THREADS": "1",
        "RAY_USAGE_STATS_ENABLED": "0",
        "RAY_TRAIN_ENABLE_STATE_TRACKING": "0",
        # Train's controller polls its workers every 2 s by default: these runs end within a poll,
        # so each fit waited for the next one; a short poll ends it as soon as the workers are done.
        "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "0.1",
    }
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    ray.init(
        num_cpus=2,
        include_dashboard=False,
        object_store_memory=80 * 1024 * 1024,
        _node_ip_address="127.0.0.1",
        _temp_dir=str(tmp_path_factory.mktemp("ray")),
        log_to_driver=False,
        runtime_env={"env_vars": env},
    )
    try:
        yield tmp_path_factory.mktemp("ray-runs")
    finally:
        ray.shutdown()
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def fit(storage: Path, name: str, loop, config: dict):
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    trainer = TorchTrainer(
        loop,
        train_loop_config=config,
        scaling_config=ScalingConfig(num_workers=2, use_gpu=False),
        run_config=RunConfig(name=name, storage_path=str(storage)),
    )
    return trainer.fit()


def launched(tmp_path: Path, loop: str = "train_loop", *flags: str) -> dict:
    """The same loop under `cadence launch --cpu --num_processes 2`."""
    script = tmp_path / f"run_{loop}.py"
    out = tmp_path / f"launched_{loop}.pt"
    script.write_text(f"from ray_train_loop import {loop}\n{loop}({{'out': {str(out)!r}}})\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CADENCE_", "PET_"))}
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(name, None)
    env["PYTHONPATH"] = os.pathsep.join([str(TESTS), str(SRC), env.get("PYTHONPATH", "")])
    result = subprocess.run(
        [*CADENCE, "launch", "--cpu", "--num_processes", "2", *flags, str(script)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-4000:]
    return torch.load(out)


def assert_same(expected: dict, got: dict) -> None:
    assert expected.keys() == got.keys()
    for key in expected:
        assert torch.equal(expected[key], got[key]), key


def test_ray_workers_end_like_cadence_launch_and_resume_bit_identical(cluster):
    from ray_train_loop import train_loop

    reference = cluster / "uninterrupted.pt"
    fit(cluster, "uninterrupted", train_loop, {"out": str(reference)})
    uninterrupted = torch.load(reference)
    assert_same(launched(cluster), uninterrupted)

    # Preempted right after the checkpoint of step 7 (mid-epoch 1 of 6 steps per epoch).
    stopped = fit(cluster, "stopped", train_loop, {"ray": True, "save_at": 7, "stop_at": 7})
    checkpoint = stopped.checkpoint
    assert checkpoint is not None
    with checkpoint.as_directory() as folder:
        names = sorted(os.listdir(folder))
    assert {"cadence_manifest.rank0.json", "cadence_manifest.rank1.json"} <= set(names)
    assert {"random_states_0.pkl", "random_states_1.pkl", "model.safetensors"} <= set(names)
    # A run started again under its name restores its latest checkpoint, which
    # ray.train.get_checkpoint() returns in every worker. Resumed from a copy (the stopped run stays
    # as it was); once: a second resume from another copy repeated this very run (same checkpoint,
    # same name scheme) and checked nothing this one does not.
    shutil.copytree(cluster / "stopped", cluster / "resumed")
    out = cluster / "resumed.pt"
    fit(cluster, "resumed", train_loop, {"ray": True, "out": str(out)})
    assert_same(uninterrupted, torch.load(out))


def test_plain_accelerator_adopts_rays_group_unless_switched_off(cluster):
    from ray_train_loop import report_world

    for ignore in (False, True):
        out = cluster / f"world-{ignore}"
        fit(cluster, f"world-{ignore}", report_world, {"out": str(out), "ignore_group": ignore})
        seen = [json.loads(Path(f"{out}.{r}.json").read_text()) for r in range(2)]
        if ignore:  # the reference's behaviour: every worker alone, each its own main process
            assert all(s["num_processes"] == 1 and s["is_main_process"] for s in seen)
            assert all(s["distributed_type"].endswith("NO") for s in seen)
        else:
            assert all(s["num_processes"] == 2 for s in seen)
            assert all(s["distributed_type"].endswith("MULTI_CPU") for s in seen)
            assert [s["is_main_process"] for s in seen] == [True, False]


def test_transformers_trainer_through_prepare_trainer(cluster):
    """transformers' Trainer under Ray (prepare_trainer) with the `accelerate` alias of issue 23 in
    the workers ends with the weights of the same Trainer script under `cadence launch`."""
    if importlib.util.find_spec("transformers") is None:
        pytest.skip("needs transformers (the test extra installs it)")
    from ray_train_loop import hf_trainer_loop

    out = cluster / "hf-trainer.pt"
    fit(cluster, "hf-trainer", hf_trainer_loop, {"ray": True, "alias": True, "out": str(out)})
    assert_same(launched(cluster, "hf_trainer_loop", "--as-accelerate"), torch.load(out))
