"""prepare_pippy (pipeline-parallel inference) and split_between_processes, on 2 and 3 gloo processes."""

import os
import subprocess
import sys

import pytest
import torch
from torch import nn

pytest.importorskip("torch.distributed.pipelining")


class Stack(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList([nn.Linear(16, 16) for _ in range(6)])
        self.out = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = torch.relu(layer(x))
        return self.out(x)


def run_pipeline(split_points, gather_output: bool, batch_size: int):
    from cadence import PartialState
    from cadence.inference import prepare_pippy

    state = PartialState(cpu=True)
    torch.manual_seed(0)
    model = Stack().eval()
    batch = torch.randn(batch_size, 16)
    # what each micro-batch (one row per process here) gives through the plain model
    chunks = max(state.num_processes, batch_size)
    padded = (
        torch.cat([batch, torch.zeros(chunks - batch_size, 16)]) if chunks > batch_size else batch
    )
    with torch.no_grad():
        expected = torch.cat([model(row[None]) for row in padded])
    prepared = prepare_pippy(
        model, split_points=split_points, example_args=(batch[:1],), gather_output=gather_output
    )
    with torch.no_grad():
        output = prepared(batch)
    return {
        "rank": state.process_index,
        "split_points": prepared.hf_split_points,
        "output": None if output is None else output.tolist(),
        "expected": expected.tolist(),
    }


@pytest.mark.parametrize("world_size", [2, 3])
def test_auto_split_gathered_output_equals_the_plain_model(dist_pool, world_size):
    results = dist_pool(world_size).run(run_pipeline, "auto", True, world_size, timeout=240)
    splits = {tuple(r["split_points"]) for r in results}
    assert len(splits) == 1 and len(next(iter(splits))) == world_size - 1
    for result in results:
        torch.testing.assert_close(torch.tensor(result["output"]), torch.tensor(result["expected"]))


def test_explicit_split_points_output_on_the_last_process_only(dist_pool):
    results = dist_pool(3).run(run_pipeline, ["layers.2", "layers.4"], False, 3, timeout=240)
    assert [r["output"] is None for r in results] == [True, True, False]
    assert all(r["split_points"] == ["layers.2", "layers.4"] for r in results)
    torch.testing.assert_close(
        torch.tensor(results[2]["output"]), torch.tensor(results[2]["expected"])
    )


def test_a_batch_smaller_than_the_stage_count_is_padded(dist_pool):
    # 1 row over 2 processes: padded to 2 micro-batches; the output keeps the padded row
    results = dist_pool(2).run(run_pipeline, "auto", True, 1, timeout=240)
    for result in results:
        assert len(result["output"]) == 2
        torch.testing.assert_close(torch.tensor(result["output"]), torch.tensor(result["expected"]))


def bad_split_points():
    from cadence import PartialState
    from cadence.inference import prepare_pippy

    PartialState(cpu=True)
    errors = []
    for split_points in (["layers.9"], ["layers.1", "layers.2"], "middle"):
        try:
            prepare_pippy(Stack(), split_points=split_points, example_args=(torch.randn(1, 16),))
        except ValueError as e:
            errors.append(str(e))
    return errors


def test_bad_split_points_are_clear_errors(dist_pool):
    for errors in dist_pool(2).run(bad_split_points):
        assert "split_points ['layers.9'] are not modules of Stack" in errors[0]
        assert "2 split point(s) make 3 stages, but 2 processes run" in errors[1]
        assert 'split_points must be "auto" or a list of module names' in errors[2]


def test_the_distributed_inference_example_runs_through_cadence_launch():
    example = os.path.join(os.path.dirname(__file__), "..", "examples", "distributed_inference.py")
    cadence = os.path.join(os.path.dirname(sys.executable), "cadence")
    result = subprocess.run(
        [cadence, "launch", "--cpu", "--num_processes", "2", example],
        capture_output=True, text=True, timeout=300, env=dict(os.environ, OMP_NUM_THREADS="1"),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    lines = sorted(line for line in result.stdout.splitlines() if line.startswith("rank"))
    assert len(lines) == 2, (result.stdout, result.stderr[-3000:])
    # split_between_processes: 5 prompts, 3 on rank 0 and 2 on rank 1, all gathered in order
    assert lines[0].startswith("rank 0 scored prompts [0, 1, 2]")
    assert lines[1].startswith("rank 1 scored prompts [3, 4]")
    assert "all 5 scores gathered in prompt order: True" in result.stdout
    assert "pipeline output matches the plain model: True" in result.stdout
