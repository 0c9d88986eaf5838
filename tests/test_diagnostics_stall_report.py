"""A rank that stays away from a collective: first one report saying where every rank is (the job goes
on), then, at the stuck timeout, the stop. Real jobs through `cadence launch --cpu`, with the delays set
through the documented environment variables (CADENCE_STALL_REPORT, CADENCE_STUCK_TIMEOUT).

No test waits for a duration: the stalled rank is released by the test when the report has appeared on
the launcher's output.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

from cadence.diagnostics.settings import resolve_watch_settings

CADENCE = [sys.executable, "-m", "cadence.commands.cli"]

SCRIPT = textwrap.dedent(
    """
    import os, sys, time, torch
    from cadence import Accelerator

    torch.set_num_threads(1)
    out, barrier = sys.argv[1], sys.argv[2] == "barrier"
    acc = Accelerator(cpu=True)
    rank = acc.process_index
    open(f"{out}/rank{rank}.pid", "w").write(str(os.getpid()))
    for step in range(8):
        if rank == 2 and step == 3:
            while not os.path.exists(f"{out}/release"):
                time.sleep(0.05)  # AWAY
        if barrier:
            acc.wait_for_everyone()  # BARRIER
        else:
            acc.gather(torch.ones(1))  # GATHER
    open(f"{out}/done{rank}", "w").write("ok")
    """
)
REPORT = "Cadence: no progress"


def line_of(marker: str) -> int:
    return next(
        i for i, line in enumerate(SCRIPT.splitlines(), 1) if line.rstrip().endswith(marker)
    )


def run_job(
    tmp_path: Path, mode: str, env: dict[str, str], release_on_report: bool
) -> tuple[int, str]:
    """Run 3 ranks; when a stall report names rank 2 where it waits, release it (if asked).
    Returns (exit code, output)."""
    (tmp_path / "job.py").write_text(SCRIPT)
    job = subprocess.Popen(
        [*CADENCE, "launch", "--cpu", "--num_processes", "3", "--quiet", "job.py", str(tmp_path), mode],
        cwd=tmp_path, env=dict(os.environ, OMP_NUM_THREADS="1", **env), stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True, start_new_session=True,
    )  # fmt: skip
    lines: list[str] = []

    def read() -> None:
        for line in job.stdout:
            lines.append(line)
            if release_on_report and f"rank 2 is at job.py:{line_of('# AWAY')}" in line:
                (tmp_path / "release").write_text("")

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        job.wait(timeout=150)
    except subprocess.TimeoutExpired:
        os.killpg(job.pid, signal.SIGKILL)
        for pid_file in tmp_path.glob("rank*.pid"):
            try:
                os.kill(int(pid_file.read_text()), signal.SIGKILL)
            except (ProcessLookupError, ValueError):
                pass
        job.wait()
        reader.join(timeout=10)
        raise AssertionError("the job did not end:\n" + "".join(lines)) from None
    reader.join(timeout=30)
    return job.returncode, "".join(lines)


def assert_report_names_every_rank(output: str, call_marker: str, operation: str) -> None:
    # Once per stall, from one rank. (A loaded machine may stall elsewhere too: those are other stalls.)
    reports = [REPORT + chunk for chunk in output.split(REPORT)[1:]]
    away = f"rank 2 is at job.py:{line_of('# AWAY')} (not in a collective"
    about_rank_2 = [r for r in reports if away in r.split("This is only a report")[0]]
    assert len(about_rank_2) == 1, output
    report = about_rank_2[0]
    assert "for rank 2. Where each rank is:" in report, report
    assert re.search(
        rf"ranks 0, 1 wait in {operation} #\d+ at job\.py:{line_of(call_marker)}", report
    ), report
    assert "This is only a report: the job goes on" in report


def test_a_stall_is_reported_once_and_the_job_goes_on(tmp_path):
    code, output = run_job(
        tmp_path, "gather", {"CADENCE_STALL_REPORT": "1", "CADENCE_STUCK_TIMEOUT": "600"}, True
    )
    assert code == 0, output
    assert_report_names_every_rank(output, "# GATHER", "gather")
    assert "every rank stops at 600 s of waiting if nothing changes" in output
    assert all((tmp_path / f"done{r}").exists() for r in range(3))


def test_a_stall_in_wait_for_everyone_with_the_default_stuck_timeout_is_reported(tmp_path):
    """Barriers keep the process-group timeout as their stop (a rank may be saving a checkpoint), but
    the report still comes after the stall delay."""
    code, output = run_job(tmp_path, "barrier", {"CADENCE_STALL_REPORT": "1"}, True)
    assert code == 0, output
    assert_report_names_every_rank(output, "# BARRIER", "wait_for_everyone")
    assert "every rank stops at 1800 s of waiting if nothing changes" in output


def test_a_rank_that_stays_away_is_reported_then_stopped_at_the_stuck_timeout(tmp_path):
    code, output = run_job(
        tmp_path, "gather", {"CADENCE_STALL_REPORT": "1", "CADENCE_STUCK_TIMEOUT": "4"}, False
    )
    assert code != 0
    assert_report_names_every_rank(output, "# GATHER", "gather")
    stop = output.index("rank 2 did not join gather")
    assert output.index(REPORT) < stop, output  # the report came first, then the stop
    assert "stuck timeout of 4 s" in output[stop:]


def test_the_documented_defaults():
    """README: the report after 30 s, the stop after 300 s (the process-group timeout, 30 min by default,
    for wait_for_everyone); CADENCE_STALL_REPORT=0 turns the report off."""
    settings = resolve_watch_settings(None, {}, process_group_timeout=1800.0, env={})
    assert settings.stall_report == 30.0 and settings.stuck_timeout == 300.0
    assert settings.deadline("gather", None) == 300.0
    assert settings.deadline("wait_for_everyone", None) == 1800.0
    off = resolve_watch_settings(None, {}, env={"CADENCE_STALL_REPORT": "0"})
    assert off.stall_report is None
