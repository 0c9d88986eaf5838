"""One live writer per project_dir (issue 24, item 6): a second job saving automatically named
checkpoints into the same project_dir is refused on every rank, naming the other job, before it
writes anything; the lock of a job that died is taken over. Real jobs (subprocesses)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

from cadence.checkpointing.writer_lock import read_holder

SRC = str(Path(__file__).resolve().parents[1] / "src")
CADENCE = [sys.executable, "-m", "cadence.commands.cli"]

JOB = textwrap.dedent(
    """
    import os, sys, time, torch
    from cadence import Accelerator
    from cadence.utils import ProjectConfiguration
    project, hold = sys.argv[1], sys.argv[2]
    config = ProjectConfiguration(project_dir=project, automatic_checkpoint_naming=True)
    accelerator = Accelerator(cpu=True, project_config=config)
    model = accelerator.prepare(torch.nn.Linear(4, 4))
    try:
        if os.path.isdir(os.path.join(project, "checkpoints")):
            accelerator.load_state()  # resume: continues the numbering
        accelerator.save_state()
    except Exception as e:
        print(f"REFUSED {type(e).__name__}: {e}", flush=True)
        sys.exit(3)
    print("SAVED", os.getpid(), flush=True)
    if hold != "-":  # keep the lock until told to go (bounded)
        for _ in range(600):
            if os.path.exists(hold):
                break
            time.sleep(0.1)
    """
)


SAVE_TWICE = textwrap.dedent(
    """
    import os, sys, time, torch
    from cadence import Accelerator
    from cadence.utils import ProjectConfiguration
    project, hold = sys.argv[1], sys.argv[2]
    config = ProjectConfiguration(
        project_dir=project, automatic_checkpoint_naming=True, total_limit=1
    )
    accelerator = Accelerator(cpu=True, project_config=config)
    model = accelerator.prepare(torch.nn.Linear(4, 4))
    accelerator.save_state()
    accelerator.save_state()
    print("SAVED", os.getpid(), flush=True)
    for _ in range(600):  # keep the lock until told to go (bounded)
        if os.path.exists(hold):
            break
        time.sleep(0.1)
    """
)


def _env(**extra: str) -> dict:
    env = dict(os.environ, PYTHONPATH=SRC + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.update(extra)
    return env


def _start_holder(tmp_path: Path, project: Path, release: Path) -> subprocess.Popen:
    (tmp_path / "job.py").write_text(JOB)
    holder = subprocess.Popen(
        [sys.executable, str(tmp_path / "job.py"), str(project), str(release)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_env(SLURM_JOB_ID="4242"),
    )
    line = holder.stdout.readline()  # blocks until its first save committed (or it failed)
    assert line.startswith("SAVED"), line + holder.stderr.read()
    return holder


def _checkpoints(project: Path) -> list[str]:
    folder = project / "checkpoints"
    return sorted(os.listdir(folder)) if folder.is_dir() else []


def test_second_live_job_is_refused_naming_the_first_and_writes_nothing(tmp_path):
    project = tmp_path / "project"
    release = tmp_path / "release"
    holder = _start_holder(tmp_path, project, release)
    try:
        before = _checkpoints(project)
        second = subprocess.run(
            [sys.executable, str(tmp_path / "job.py"), str(project), "-"],
            capture_output=True,
            text=True,
            timeout=240,
            env=_env(),
        )
        assert second.returncode == 3, second.stdout + second.stderr
        assert "REFUSED WriterLockedError" in second.stdout
        assert f"pid {holder.pid}" in second.stdout  # names the other job ...
        assert "SLURM_JOB_ID=4242" in second.stdout  # ... with its scheduler's job id
        assert "rank 0" in second.stdout
        assert _checkpoints(project) == before  # nothing written by the refused job
    finally:
        release.write_text("go")
        holder.wait(timeout=120)
    # once the first job ended, the lock is free again
    third = subprocess.run(
        [sys.executable, str(tmp_path / "job.py"), str(project), "-"],
        capture_output=True,
        text=True,
        timeout=240,
        env=_env(),
    )
    assert third.returncode == 0, third.stdout + third.stderr
    assert len(_checkpoints(project)) == len(before) + 1


def test_the_lock_adds_no_entry_to_the_project_folder(tmp_path):
    """Accelerate's test_with_save_limit: after two saves with total_limit=1 the project folder holds
    `checkpoints` only, and that `checkpoint_1` only (Accelerate's resume reads every name there as
    a numbered checkpoint), while the lock is held and after the job ended."""
    project = tmp_path / "project"
    release = tmp_path / "release"
    (tmp_path / "twice.py").write_text(SAVE_TWICE)
    holder = subprocess.Popen(
        [sys.executable, str(tmp_path / "twice.py"), str(project), str(release)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_env(SLURM_JOB_ID="77"),
    )
    try:
        line = holder.stdout.readline()
        assert line.startswith("SAVED"), line + holder.stderr.read()
        assert os.listdir(project) == ["checkpoints"]
        assert os.listdir(project / "checkpoints") == ["checkpoint_1"]
        assert read_holder(project)["job"] == {"SLURM_JOB_ID": "77"}  # the lock is held ...
        (tmp_path / "job.py").write_text(JOB)
        second = subprocess.run(
            [sys.executable, str(tmp_path / "job.py"), str(project), "-"],
            capture_output=True,
            text=True,
            timeout=240,
            env=_env(),
        )
        assert second.returncode == 3, second.stdout + second.stderr  # ... and keeps its guarantee
        assert f"pid {holder.pid}" in second.stdout and "SLURM_JOB_ID=77" in second.stdout
    finally:
        release.write_text("go")
        holder.wait(timeout=120)
    assert os.listdir(project) == ["checkpoints"]
    assert os.listdir(project / "checkpoints") == ["checkpoint_1"]


def test_lock_of_a_killed_job_is_taken_over(tmp_path):
    project = tmp_path / "project"
    holder = _start_holder(tmp_path, project, tmp_path / "never")
    holder.send_signal(signal.SIGKILL)
    holder.wait(timeout=60)
    stale = read_holder(project)
    assert stale["pid"] == holder.pid  # the dead job's record is still there
    after = subprocess.run(
        [sys.executable, str(tmp_path / "job.py"), str(project), "-"],
        capture_output=True,
        text=True,
        timeout=240,
        env=_env(),
    )
    assert after.returncode == 0, after.stdout + after.stderr
    taken = read_holder(project)
    assert taken["pid"] != holder.pid


def test_refusal_reaches_every_rank_of_a_two_process_job(tmp_path):
    project = tmp_path / "project"
    release = tmp_path / "release"
    holder = _start_holder(tmp_path, project, release)
    try:
        before = _checkpoints(project)
        second = subprocess.run(
            [*CADENCE, "launch", "--cpu", "--num_processes", "2", "--quiet"]
            + [str(tmp_path / "job.py"), str(project), "-"],
            capture_output=True,
            text=True,
            timeout=300,
            env=_env(),
            cwd=tmp_path,
        )
        output = second.stdout + second.stderr
        assert second.returncode != 0, output
        for rank in (0, 1):
            assert f"save_state refused on rank {rank}" in output, output
        assert f"pid {holder.pid}" in output
        assert _checkpoints(project) == before
    finally:
        release.write_text("go")
        holder.wait(timeout=120)


def test_switching_the_lock_off_lets_a_second_job_save_as_the_reference_does(tmp_path):
    project = tmp_path / "project"
    release = tmp_path / "release"
    holder = _start_holder(tmp_path, project, release)
    try:
        second = subprocess.run(
            [sys.executable, str(tmp_path / "job.py"), str(project), "-"],
            capture_output=True,
            text=True,
            timeout=240,
            env=_env(CADENCE_PROJECT_DIR_LOCK="0"),
        )
        assert second.returncode == 0, second.stdout + second.stderr
        assert "SAVED" in second.stdout
    finally:
        release.write_text("go")
        holder.wait(timeout=120)
