"""`cadence launch --parallelism_config_pp_size N` (and the config file's `parallelism_config` key): the
plan checks the values before any worker starts and hands them to every worker's ParallelismConfig;
one real launch trains a pipeline over 2 gloo processes."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest
import torch

from cadence.launch.args import build_launch_parser
from cadence.launch.plan import LaunchPlanError, build_plan
from cadence.launch.worker_env import worker_environment

CADENCE = [sys.executable, "-m", "cadence.commands.cli"]


def plan_for(argv):
    parser, _ = build_launch_parser()
    args, unknown = parser.parse_known_args(argv)
    assert not unknown
    return build_plan(args, env={}, gpu_count=lambda: 0)


def test_flags_reach_the_workers_environment(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text("print('hi')\n")
    plan = plan_for(
        ["--cpu", "--num_processes", "4", "--parallelism_config_pp_size", "2",
         "--parallelism_config_pp_schedule", "GPipe", "train.py"]
    )  # fmt: skip
    env = worker_environment(plan, None, {})
    assert env["PARALLELISM_CONFIG_PP_SIZE"] == "2"
    assert env["PARALLELISM_CONFIG_PP_SCHEDULE"] == "GPipe"
    assert env["ACCELERATE_USE_PARALLELISM_CONFIG"] == "true"
    config = tmp_path / "c.json"
    config.write_text(
        json.dumps(
            {"distributed_type": "MULTI_CPU", "use_cpu": True, "num_processes": 2,
             "parallelism_config": {"parallelism_config_pp_size": 2, "tp_size": 1}}
        )
    )  # fmt: skip
    plan = plan_for(["--config_file", str(config), "train.py"])
    assert worker_environment(plan, None, {})["PARALLELISM_CONFIG_PP_SIZE"] == "2"
    assert any("tp_size" in note for note in plan.notes)


@pytest.mark.parametrize(
    "argv,words",
    [
        (["--num_processes", "4", "--parallelism_config_pp_size", "3"], "divide the number"),
        (["--parallelism_config_pp_schedule", "Zigzag"], "Unknown pipeline schedule"),
    ],
)
def test_bad_values_are_refused_before_any_worker(tmp_path, monkeypatch, argv, words):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text("print('hi')\n")
    with pytest.raises(LaunchPlanError, match=words):
        plan_for(["--cpu", *argv, "train.py"])


SCRIPT = textwrap.dedent(
    """
    import torch
    from cadence import Accelerator
    from cadence.plugins import ParallelismConfig, PipelineParallelConfig

    def mse(output, target):
        return torch.nn.functional.mse_loss(output, target)

    # pp_size comes from --parallelism_config_pp_size; the loss from the script.
    config = ParallelismConfig(pp_handler=PipelineParallelConfig(loss_fn=mse))
    acc = Accelerator(parallelism_config=config)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.05)
    model, optimizer = acc.prepare(model, optimizer)
    x, y = torch.randn(8, 4), torch.randn(8, 1)
    losses = []
    for _ in range(3):
        loss = model(x, labels=y)
        acc.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(f"{loss.item():.6f}")
    print(f"rank {acc.process_index} on {acc.device.type} pp {config.pp_size} "
          f"{config.pp_handler.schedule} losses {' '.join(losses)}")
    acc.end_training()
    """
)


def expected_losses() -> str:
    """The same 3 steps in one process, plain PyTorch on the CPU."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.05)
    x, y = torch.randn(8, 4), torch.randn(8, 1)
    losses = []
    for _ in range(3):
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return losses


def launch(tmp_path, *flags):
    script = tmp_path / "pp.py"
    script.write_text(SCRIPT)
    result = subprocess.run(
        [*CADENCE, "launch", *flags, "--num_processes", "2", "--parallelism_config_pp_size", "2",
         "--parallelism_config_pp_schedule", "gpipe", str(script)],
        capture_output=True, text=True, timeout=180, cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    lines = {}
    for line in result.stdout.splitlines():
        if line.startswith("rank "):
            words = line.split()
            lines[int(words[1])] = (words[3], words[5], words[6], [float(v) for v in words[8:]])
    return lines


def test_a_real_launch_trains_a_pipeline_on_gloo(tmp_path):
    lines = launch(tmp_path, "--cpu")
    for rank in (0, 1):
        device, size, schedule, losses = lines[rank]
        assert (device, size, schedule) == ("cpu", "2", "GPipe")
        assert losses == pytest.approx(expected_losses(), abs=1e-5)


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two NVIDIA GPUs (NCCL)")
def test_a_real_launch_trains_a_pipeline_on_nccl(tmp_path):
    lines = launch(tmp_path)
    for rank in (0, 1):
        device, size, schedule, losses = lines[rank]
        assert (device, size, schedule) == ("cuda", "2", "GPipe")
        assert losses == pytest.approx(expected_losses(), abs=1e-4)
