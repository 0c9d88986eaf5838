"""Elastic launch for real: two `cadence launch --nnodes 1:2` processes on 127.0.0.1 as two nodes.

A stop notice to one node, and a node joining mid-run, both end with every sample of every epoch
trained exactly once: the job checkpoints at the step boundary every rank agreed on and continues at
the new world size from there.
"""

from __future__ import annotations

import os
import signal

import pytest
from elastic_helpers import (
    TRAIN_SCRIPT,
    children,
    port_open,
    sample_counts,
    start_node,
    steps,
    stop_all,
    wait_until,
)

from harness import free_port

pytestmark = pytest.mark.skipif(not hasattr(signal, "SIGKILL"), reason="POSIX signals needed")
EPOCHS, SAMPLES = 2, 48


def _every_sample_once(tmp_path):
    counts = sample_counts(steps(tmp_path))
    expected = {(epoch, sample) for epoch in range(EPOCHS) for sample in range(SAMPLES)}
    assert set(counts) == expected, "some samples were never trained"
    redone = {key: n for key, n in counts.items() if n != 1}
    assert not redone, f"samples trained more than once: {sorted(redone)[:8]}"


def _notice_to_node_b(tmp_path, notify) -> tuple[str, str]:
    """Nodes a and b train together, `notify(b)` gives b a stop notice; b must end with 75 ("resume
    me": a checkpoint was committed) and a finish alone. Returns the outputs of a and b."""
    script = tmp_path / "train.py"
    script.write_text(TRAIN_SCRIPT)
    port = free_port()
    first = start_node(tmp_path, port, "a", script)
    # Node a hosts the rendezvous store (the endpoint host must outlive the job): b starts after it.
    assert wait_until(lambda: port_open(port) or first.poll() is not None, limit=60)
    second = start_node(tmp_path, port, "b", script)
    try:
        together = lambda: sum(r["world"] == 2 for r in steps(tmp_path)) >= 3  # noqa: E731
        ended = lambda: first.poll() is not None or second.poll() is not None  # noqa: E731
        assert wait_until(lambda: together() or ended(), limit=120) and together(), (
            "the two nodes never trained together:\n" + (tmp_path / "a.out").read_text()
        )
        notify(second)
        assert second.wait(timeout=90) == 75
        assert first.wait(timeout=150) == 0  # node a went on alone to the end
    finally:
        stop_all(first, second)
    out_a = (tmp_path / "a.out").read_text()
    out_b = (tmp_path / "b.out").read_text()
    assert "world size 2 -> 1" in out_a and "world size 2 -> 2" not in out_a, out_a
    assert "resumed at epoch" in out_a and "finished" in out_a, out_a
    assert "Cadence: resumed from " in out_a and "checkpoint_0 at world size 1" in out_a, out_a
    # The job's first save (restart generation 1) has no checkpoints folder to fence yet: no warning.
    assert "could not record generation" not in out_a + out_b, out_a + out_b
    # Node b took itself out of the rendezvous (a's new round did not wait for b's heartbeats).
    assert "cadence launch: this node left the job (rendezvous round" in out_b, out_b
    worlds = [r["world"] for r in steps(tmp_path)]
    assert 2 in worlds and worlds[-1] == 1  # trained together, then alone
    _every_sample_once(tmp_path)
    return out_a, out_b


def test_stop_notice_to_one_node_checkpoints_and_the_other_goes_on_alone(tmp_path):
    # The scheduler's notice to node b's launcher.
    _, out_b = _notice_to_node_b(tmp_path, lambda b: b.send_signal(signal.SIGTERM))
    assert "stopped by SIGTERM; the workers committed a checkpoint" in out_b, out_b


def test_a_stop_notice_to_one_rank_makes_its_node_leave_like_a_notice_to_its_launcher(tmp_path):
    def notify_the_worker(b) -> None:  # the notice reaches one rank only, not its launcher
        workers = children(b.pid)
        assert len(workers) == 1, f"node b should run one worker, found {workers}"
        os.kill(workers[0], signal.SIGTERM)

    _, out_b = _notice_to_node_b(tmp_path, notify_the_worker)
    assert "got the stop notice (SIGTERM); the workers committed a checkpoint" in out_b, out_b


def test_a_node_joining_mid_run_continues_at_the_larger_size_without_redoing_a_step(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(TRAIN_SCRIPT)
    port = free_port()
    first = start_node(tmp_path, port, "a", script, STEP_SLEEP="1.2")
    second = None
    try:
        started = lambda: len(steps(tmp_path)) >= 1 or first.poll() is not None  # noqa: E731
        assert wait_until(started, limit=120) and first.poll() is None, (
            "node a never trained:\n" + (tmp_path / "a.out").read_text()
        )
        second = start_node(tmp_path, port, "b", script, STEP_SLEEP="1.2")
        assert first.wait(timeout=180) == 0
        assert second.wait(timeout=60) == 0
    finally:
        stop_all(first, *([second] if second else []))
    out_a = (tmp_path / "a.out").read_text()
    assert "world size 1 -> 2" in out_a, out_a
    worlds = [r["world"] for r in steps(tmp_path)]
    assert worlds[0] == 1 and worlds[-1] == 2, worlds
    _every_sample_once(tmp_path)
