"""Supervision on real processes: nothing outlives its job, the true cause of a stop, fencing of a
superseded worker, the stop notice in one process, and the launcher's report of unknown flags."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from elastic_helpers import CADENCE, node_env, wait_until

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux signals")

COLLECTIVES = textwrap.dedent(
    """
    import os, sys, time
    import torch
    from cadence import Accelerator
    acc = Accelerator(cpu=True)
    with open(f"pid{acc.process_index}", "w") as handle:
        handle.write(str(os.getpid()))
    for _ in range(100000):
        acc.reduce(torch.ones(1), "sum")
        time.sleep(0.05)
    """
)


def _alive(pid: int) -> bool:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return False
    return "\nState:\tZ" not in status


def _start_two_ranks(tmp_path: Path, **env: str) -> tuple[subprocess.Popen, list[int]]:
    (tmp_path / "job.py").write_text(COLLECTIVES)
    launcher = subprocess.Popen(
        [*CADENCE, "launch", "--cpu", "--quiet", "--num_processes", "2", "job.py"],
        cwd=tmp_path,
        env=node_env(tmp_path, **env),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    files = [tmp_path / "pid0", tmp_path / "pid1"]
    ready = lambda: all(f.exists() and f.read_text() for f in files)  # noqa: E731
    if not wait_until(lambda: ready() or launcher.poll() is not None, limit=120) or not ready():
        launcher.kill()
        pytest.fail(f"the workers never started: {launcher.communicate(timeout=30)}")
    return launcher, [int(f.read_text()) for f in files]


def _kill_left(pids: list[int]) -> None:
    for pid in pids:
        if _alive(pid):
            os.kill(pid, signal.SIGKILL)


@pytest.mark.parametrize(
    "signals",
    [("SIGINT",), ("SIGTERM",), ("SIGKILL",), ("SIGTERM", "SIGKILL")],
    ids=["sigint", "sigterm", "sigkill", "sigterm-then-sigkill"],
)
def test_no_worker_outlives_its_launcher_even_a_frozen_one(tmp_path, signals):
    launcher, workers = _start_two_ranks(tmp_path, CADENCE_STOP_GRACE="5")
    try:
        time.sleep(0.5)  # both ranks in their loop of collectives
        os.kill(workers[1], signal.SIGSTOP)  # rank 1 frozen; rank 0 soon waits in a collective
        time.sleep(0.5)
        for index, name in enumerate(signals):
            if index:
                time.sleep(0.5)  # the scheduler's `kill -TERM`, then `kill -KILL` within 1 s
            launcher.send_signal(getattr(signal, name))
        launcher.communicate(timeout=60)
        assert wait_until(lambda: not any(_alive(pid) for pid in workers), limit=5), (
            f"workers alive 5 s after the launcher ended: {[p for p in workers if _alive(p)]}"
        )
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait(timeout=30)
        _kill_left(workers)


def test_a_frozen_rank_is_stopped_by_the_launcher_and_the_summary_says_so(tmp_path):
    launcher, workers = _start_two_ranks(tmp_path, CADENCE_STUCK_TIMEOUT="5")
    try:
        time.sleep(0.5)
        os.kill(workers[1], signal.SIGSTOP)
        _, stderr = launcher.communicate(timeout=120)
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait(timeout=30)
        _kill_left(workers)
    assert launcher.returncode == 1
    assert "rank 1 did not join" in stderr, stderr
    assert "rank 1: stopped by the launcher after the stuck timeout" in stderr, stderr
    assert "out of memory" not in stderr, stderr


SAVES_FOREVER = textwrap.dedent(
    """
    import os, sys, time
    import torch
    from cadence import Accelerator
    from cadence.utils import ProjectConfiguration
    config = ProjectConfiguration(project_dir=sys.argv[1], automatic_checkpoint_naming=True,
                                  total_limit=int(sys.argv[3]))
    acc = Accelerator(cpu=True, project_config=config)
    model = acc.prepare(torch.nn.Linear(4, 4))
    folder = os.path.join(sys.argv[1], "checkpoints")
    if os.path.isdir(folder):  # continue the numbering after the checkpoints already there
        taken = [int(n.split("_")[1]) for n in os.listdir(folder) if n.startswith("checkpoint_")]
        acc.project_configuration.iteration = max(taken) + 1
    for _ in range(int(sys.argv[2])):
        acc.save_state()
        print("saved", flush=True)
        time.sleep(0.2)
    """
)


def _checkpoints(project: Path) -> list[str]:
    return sorted(p.name for p in (project / "checkpoints").iterdir() if not p.name.startswith("."))


def test_a_worker_of_an_older_generation_never_writes_after_a_newer_one_started(tmp_path):
    script = tmp_path / "saves.py"
    script.write_text(SAVES_FOREVER)
    project = tmp_path / "project"
    old = subprocess.Popen(
        [sys.executable, str(script), str(project), "1000", "3"],
        env=node_env(tmp_path, CADENCE_RESTART_GENERATION="1"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert old.stdout.readline().strip() == "saved", old.stderr.read()
        os.kill(old.pid, signal.SIGSTOP)  # frozen (a paused VM) while the job moved on
        new = subprocess.run(
            [sys.executable, str(script), str(project), "2", "3"],
            env=node_env(tmp_path, CADENCE_RESTART_GENERATION="2"),
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert new.returncode == 0, new.stderr
        before = _checkpoints(project)
        os.kill(old.pid, signal.SIGCONT)
        _, stderr = old.communicate(timeout=60)
        assert old.returncode == 76, stderr
        assert "superseded" in stderr and "generation 2" in stderr, stderr
        assert _checkpoints(project) == before  # nothing committed, renamed or deleted
    finally:
        if old.poll() is None:
            os.kill(old.pid, signal.SIGCONT)
            old.kill()
            old.wait(timeout=30)


TRAINS_ALONE = textwrap.dedent(
    """
    import os, sys, time
    import torch
    from cadence import Accelerator
    from cadence.tracking import GeneralTracker
    from cadence.utils import ProjectConfiguration

    class Marker(GeneralTracker):  # writes what it logged to a file when finished
        name, requires_logging_directory = "marker", False
        def __init__(self, path):
            super().__init__()
            self.path, self.logged = path, []
        @property
        def tracker(self):
            return self
        def store_init_configuration(self, values):
            pass
        def log(self, values, step=None, **kwargs):
            self.logged.append(step)
        def finish(self):
            with open(self.path, "w") as f:
                f.write(f"finished after {len(self.logged)} logs")

    config = ProjectConfiguration(project_dir=sys.argv[1], automatic_checkpoint_naming=True)
    marker = Marker(os.path.join(sys.argv[1], "tracker.txt"))
    acc = Accelerator(cpu=True, project_config=config, log_with=[marker])
    acc.init_trackers("run")
    model = torch.nn.Linear(1, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model, opt = acc.prepare(model, opt)
    loader = acc.prepare_data_loader(torch.utils.data.DataLoader(list(range(10000)), batch_size=2))
    for step, batch in enumerate(loader):
        acc.backward(model(batch.float().unsqueeze(1)).sum())
        opt.step()
        opt.zero_grad()
        acc.log({"step": step + 1}, step=step + 1)
        print(f"step {step + 1}", flush=True)
        time.sleep(0.1)
    """
)


def test_a_stop_notice_to_one_process_commits_a_checkpoint_at_the_step_boundary(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(TRAINS_ALONE)
    project = tmp_path / "project"
    job = subprocess.Popen(
        [sys.executable, str(script), str(project)],
        env=node_env(tmp_path),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert job.stdout.readline().startswith("step "), job.stderr.read()
        job.send_signal(signal.SIGTERM)
        out, err = job.communicate(timeout=60)
    finally:
        if job.poll() is None:
            job.kill()
            job.wait(timeout=30)
    assert job.returncode == 75, err
    last_step = int([line for line in out.splitlines() if line.startswith("step ")][-1].split()[1])
    assert f"committed after step {last_step + 1}" in err or f"after step {last_step}" in err, err
    assert _checkpoints(project) == ["checkpoint_0"]
    # The process ends at once after the checkpoint (no atexit handlers): its trackers were
    # finished first, with everything logged up to the stop.
    assert (project / "tracker.txt").read_text().startswith("finished after "), err
    logged = int((project / "tracker.txt").read_text().split()[2])
    assert logged >= last_step, (logged, last_step)


def test_an_unknown_flag_is_reported_once_and_valid_flags_around_it_are_not(tmp_path):
    (tmp_path / "s.py").write_text("print('hi')\n")
    result = subprocess.run(
        [*CADENCE, "launch", "--bogus", "3", "--num_processes", "1", "--max_restarts", "3", "s.py"],
        cwd=tmp_path,
        env=node_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert result.stderr.count("unknown flag") == 1, result.stderr
    assert "--bogus: unknown flag" in result.stderr
    assert "--num_processes" not in result.stderr and "--max_restarts" not in result.stderr
    typo = subprocess.run(
        [*CADENCE, "launch", "--num_proceses", "1", "s.py"],
        cwd=tmp_path,
        env=node_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert "did you mean --num_processes?" in typo.stderr, typo.stderr
    elastic = subprocess.run(
        [
            *CADENCE,
            "launch",
            "--cpu",
            "--dry_run",
            "--nnodes",
            "1:2",
            "--num_processes",
            "1",
            "--max_restarts",
            "3",
            "--rdzv_endpoint",
            "127.0.0.1:29400",
            "s.py",
        ],  # fmt: skip
        cwd=tmp_path,
        env=node_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert elastic.returncode == 0, elastic.stderr
    assert "--nnodes 1:2 --nproc_per_node 1 --rdzv_backend c10d" in elastic.stdout
    assert "keep_alive_interval=1" in elastic.stdout
