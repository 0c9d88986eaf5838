"""Tracking and profiling through the `Accelerator`, in 2 real processes: the user-facing story."""

from __future__ import annotations

import glob
import json
import os

import pytest

from cadence.accelerator import Accelerator

pytestmark = pytest.mark.skipif(
    not hasattr(Accelerator, "init_trackers"),
    reason="the Accelerator does not delegate to TrackerHub yet",
)


def track_a_short_run(project_dir):
    import torch

    from cadence.accelerator import Accelerator
    from cadence.tracking import GeneralTracker, NoOpTracker

    class EveryRank(GeneralTracker):
        name = "every_rank"
        requires_logging_directory = False
        main_process_only = False

        def __init__(self):
            super().__init__()
            self.logged = []

        @property
        def tracker(self):
            return self.logged

        def log(self, values, step=None, **kwargs):
            self.logged.append((step, dict(values)))

    every_rank = EveryRank()
    accelerator = Accelerator(log_with=["tensorboard", every_rank], project_dir=project_dir)
    accelerator.init_trackers("short_run", config={"lr": 0.1, "dtype": str(torch.float32)})
    for step in range(3):
        accelerator.log({"loss": 1.0 / (step + 1)}, step=step)
    writer = accelerator.get_tracker("tensorboard", unwrap=True)
    writer.add_scalar("extra", 5.0, 0)  # no `if is_main_process` guard needed
    stand_in = isinstance(accelerator.get_tracker("tensorboard"), NoOpTracker)
    names = sorted(tracker.name for tracker in accelerator.trackers)
    accelerator.end_training()
    return {"names": names, "stand_in": stand_in, "every_rank": every_rank.logged}


def test_the_main_process_writes_one_tensorboard_run_and_every_rank_trackers_run_everywhere(
    dist_pool, tmp_path
):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    project_dir = str(tmp_path)
    main, other = dist_pool(2).run(track_a_short_run, project_dir)
    assert main["names"] == ["every_rank", "tensorboard"] and not main["stand_in"]
    assert other["names"] == ["every_rank"] and other["stand_in"]
    expected = [[step, {"loss": 1.0 / (step + 1)}] for step in range(3)]
    for rank in (main, other):
        assert [[step, values] for step, values in rank["every_rank"]] == expected

    [run_dir] = glob.glob(os.path.join(project_dir, "**", "short_run"), recursive=True)
    assert len(glob.glob(os.path.join(run_dir, "events.out.tfevents.*"))) == 1
    events = EventAccumulator(run_dir)
    events.Reload()
    assert [(e.step, e.value) for e in events.Scalars("loss")] == [
        (step, pytest.approx(1.0 / (step + 1))) for step in range(3)
    ]
    assert [(e.step, e.value) for e in events.Scalars("extra")] == [(0, 5.0)]


def profile_with_the_spec_handler(trace_dir):
    import torch

    from cadence.accelerator import Accelerator
    from cadence.options.dataclasses import ProfileKwargs

    accelerator = Accelerator(kwargs_handlers=[ProfileKwargs(output_trace_dir=trace_dir)])
    with accelerator.profile() as profiler:
        torch.mm(torch.ones(16, 16), torch.ones(16, 16))
    return "aten::mm" in {event.key for event in profiler.key_averages()}


def test_accelerator_profile_writes_one_chrome_trace_per_process(dist_pool, tmp_path):
    trace_dir = str(tmp_path / "output_trace")
    assert dist_pool(2).run(profile_with_the_spec_handler, trace_dir) == [True, True]
    assert sorted(os.listdir(trace_dir)) == ["profile_0.json", "profile_1.json"]
    for name in os.listdir(trace_dir):
        with open(os.path.join(trace_dir, name)) as handle:
            assert any(e.get("name") == "aten::mm" for e in json.load(handle)["traceEvents"])
