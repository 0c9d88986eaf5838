"""`profile`: torch.profiler around a block, with a Chrome trace per process in real processes."""

from __future__ import annotations

import json
import os

import pytest
import torch

from cadence.core.profiling import build_profiler, profile
from cadence.options.dataclasses import ProfileKwargs


def _work(steps: int = 1) -> None:
    matrix = torch.ones(32, 32)
    for _ in range(steps):
        matrix = torch.mm(matrix, matrix) / 32


def profile_to_traces(trace_dir):
    from cadence.state import PartialState

    torch.set_num_threads(1)
    state = PartialState()
    handler = ProfileKwargs(activities=["cpu"], record_shapes=True, output_trace_dir=trace_dir)
    with profile(handler, state) as profiler:
        _work()
    names = {event.key for event in profiler.key_averages()}
    # Every rank waited for the others' traces: all files are there when any rank returns.
    return sorted(os.listdir(trace_dir)), "aten::mm" in names


def test_every_process_writes_its_chrome_trace(dist_pool, tmp_path):
    trace_dir = str(tmp_path / "output_trace")
    results = dist_pool(2).run(profile_to_traces, trace_dir)
    for files, saw_matmul in results:
        assert files == ["profile_0.json", "profile_1.json"]
        assert saw_matmul
    for rank in (0, 1):
        with open(os.path.join(trace_dir, f"profile_{rank}.json")) as handle:
            trace = json.load(handle)
        names = {event.get("name") for event in trace["traceEvents"]}
        assert "aten::mm" in names
        shapes = [
            e["args"].get("Input Dims") for e in trace["traceEvents"] if e.get("name") == "aten::mm"
        ]
        assert [[32, 32], [32, 32]] in shapes


def test_the_schedule_of_the_spec_example_hands_each_recorded_cycle_to_on_trace_ready(tmp_path):
    from cadence.state import PartialState, reset_state

    reset_state()
    ready = []
    handler = ProfileKwargs(
        schedule_option=dict(wait=1, warmup=1, active=1), on_trace_ready=ready.append
    )
    with profile(handler, PartialState(cpu=True)) as profiler:
        for _ in range(10):
            _work()
            profiler.step()
    # Cycles of 3 steps (wait, warm up, record): recordings end after steps 3, 6 and 9.
    assert len(ready) == 3 and all(item is profiler for item in ready)
    assert os.listdir(tmp_path) == []  # no output_trace_dir: nothing written


def test_with_a_schedule_the_trace_file_holds_the_last_recorded_step(tmp_path):
    from cadence.state import PartialState, reset_state

    reset_state()
    handler = ProfileKwargs(
        schedule_option=dict(wait=1, warmup=1, active=1), output_trace_dir=str(tmp_path)
    )
    with profile(handler, PartialState(cpu=True)) as profiler:
        for _ in range(9):
            _work(steps=1)
            profiler.step()
    with open(tmp_path / "profile_0.json") as handle:
        events = json.load(handle)["traceEvents"]
    assert sum(event.get("name") == "aten::mm" for event in events) == 1


def test_default_settings_profile_the_block_and_write_nothing(tmp_path, monkeypatch):
    from cadence.state import PartialState, reset_state

    reset_state()
    monkeypatch.chdir(tmp_path)
    with profile(None, PartialState(cpu=True)) as profiler:
        _work()
    assert "aten::mm" in {event.key for event in profiler.key_averages()}
    assert os.listdir(tmp_path) == []


def test_profile_kwargs_build_gives_an_unstarted_profiler():
    profiler = ProfileKwargs(activities=["cpu"], with_flops=True).build()
    assert isinstance(profiler, torch.profiler.profile)
    assert profiler.with_flops


def test_bad_settings_are_rejected_before_profiling():
    with pytest.raises(ValueError, match="Invalid profiler activity: 'gpu'"):
        build_profiler(ProfileKwargs(activities=["gpu"]))
    with pytest.raises(TypeError, match=r"unknown keys \['cycles'\]"):
        build_profiler(ProfileKwargs(schedule_option={"wait": 1, "cycles": 2}))
