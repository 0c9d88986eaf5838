"""No silent hangs: real jobs under torch.distributed.run where a rank fails, dies, stalls or diverges.

Every worker loops until something stops it, and the process-group timeout is set far beyond the
subprocess timeout, so a job that finishes at all was stopped by Cadence's fail-fast / watchdog.
"""

import os
import re
import signal
import subprocess
import sys
import textwrap
import time

from cadence.core.torch_compat import failures_include_stopped_ranks
from harness import free_port

SCRIPT = textwrap.dedent(
    """
    import os, signal, sys, time, torch
    from cadence import Accelerator, InitProcessGroupKwargs
    from cadence.utils import DistributedOperationException

    torch.set_num_threads(1)
    scenario, out = sys.argv[1], sys.argv[2]
    stuck = float(os.environ.get("TEST_STUCK_TIMEOUT", "0")) or None
    acc = Accelerator(kwargs_handlers=[InitProcessGroupKwargs(timeout=600, stuck_timeout=stuck)])
    rank = acc.process_index
    open(f"{out}/rank{rank}.pid", "w").write(str(os.getpid()))

    def note(name, text):
        open(f"{out}/{name}.rank{rank}.txt", "w").write(text)

    if scenario == "mismatch":
        try:
            if rank == 0:
                acc.gather(torch.ones(2, 3))
            else:
                acc.reduce(torch.ones(2, 3))
        except DistributedOperationException as error:
            note("ops", str(error))
        try:
            acc.gather({"x": torch.ones(2, 3 + rank)})
        except DistributedOperationException as error:
            note("shapes", str(error))
        note("after", str(acc.gather(torch.tensor([rank])).tolist()))
        sys.exit(0)

    if scenario == "no_handshake":  # what NCCL sees: no pre-check, the collectives just hang
        import cadence.diagnostics.precheck as precheck

        precheck.handshake_enabled = False
        if rank == 0:
            acc.gather(torch.ones(2, 3))  # GATHER
        else:
            acc.reduce(torch.ones(2, 3))  # REDUCE

    model = torch.nn.Linear(4, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    model, optimizer = acc.prepare(model, optimizer)
    step = 0
    while True:  # until Cadence stops this rank
        if scenario == "fail" and rank == 2 and step == 5:
            note("failed_at", str(time.time()))
            raise RuntimeError("rank 2 breaks at step 5")
        if scenario == "kill" and rank == 1 and step == 5:
            note("failed_at", str(time.time()))
            os.kill(os.getpid(), signal.SIGKILL)
        loss = model(torch.randn(8, 4)).pow(2).mean()
        acc.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        if scenario == "stuck" and rank == acc.num_processes - 1 and step == 3:
            while True:
                time.sleep(0.05)  # SLEEPING
        acc.gather(loss.detach()[None])  # GATHER-STEP
        time.sleep(0.01)
        step += 1
    """
)


def line_of(marker: str) -> int:
    return next(
        i for i, line in enumerate(SCRIPT.splitlines(), 1) if line.rstrip().endswith(marker)
    )


def run_job(tmp_path, scenario, nproc, env=None):
    (tmp_path / "script.py").write_text(SCRIPT)
    started = time.monotonic()
    process = subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}",
         f"--master_port={free_port()}", "script.py", scenario, str(tmp_path)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path,
        env=dict(os.environ, OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="", **(env or {})),
        start_new_session=True,
    )  # fmt: skip
    try:
        stdout, stderr = process.communicate(timeout=90)
    except subprocess.TimeoutExpired:
        # Leave nothing behind: the workers run in sessions of their own, so by their pid files.
        for pid_file in tmp_path.glob("rank*.pid"):
            try:
                os.kill(int(pid_file.read_text()), signal.SIGKILL)
            except (ProcessLookupError, ValueError):
                pass
        os.killpg(process.pid, signal.SIGKILL)
        stdout, stderr = process.communicate()
        raise AssertionError(f"the job was not stopped:\n{stdout}{stderr}") from None
    process.ended = time.time()
    process.elapsed = time.monotonic() - started
    process.output = stdout + stderr
    return process


def assert_no_worker_left(tmp_path, nproc):
    for rank in range(nproc):
        pid = int((tmp_path / f"rank{rank}.pid").read_text())
        try:
            with open(f"/proc/{pid}/stat") as stat:
                state = stat.read().rsplit(")", 1)[1].split()[0]
        except FileNotFoundError:
            continue
        assert state == "Z", f"rank {rank} (pid {pid}) is still running after the launcher ended"


def report_stop_latency(tmp_path, result, rank):
    failed_at = float((tmp_path / f"failed_at.rank{rank}.txt").read_text())
    print(f"every rank gone {result.ended - failed_at:.1f} s after rank {rank} failed")


def test_a_rank_that_raises_stops_every_rank(tmp_path):
    result = run_job(tmp_path, "fail", 4)
    assert result.returncode != 0
    assert "RuntimeError: rank 2 breaks at step 5" in result.output
    # The others say why they stop, naming rank 2 and its error.
    assert re.search(
        r"\[rank [013]\] .*because rank 2 failed.*rank 2 breaks at step 5", result.output
    )
    # The launcher's root cause is rank 2 (its error file, written by Cadence's hook, has the traceback).
    # Before torch 2.10 torch's summary lists only the ranks that had ended when the agent noticed
    # the first failure (torch_compat: ChildFailedError.failures): a rank 2 still exiting when
    # the followers' grace ran out (a loaded machine) is missing from it, and torch names a follower.
    # Cadence's own lines above name rank 2 on every release.
    root_cause = result.output.split("Root Cause", 1)[1]
    if failures_include_stopped_ranks() or "rank      : 2" in root_cause:
        assert "rank      : 2" in root_cause and "rank 2 breaks at step 5" in root_cause
    else:
        assert re.search(r"rank      : [013]\b", root_cause), root_cause
    assert_no_worker_left(tmp_path, 4)
    report_stop_latency(tmp_path, result, 2)


def test_a_killed_rank_stops_every_rank(tmp_path):
    result = run_job(tmp_path, "kill", 2)
    assert result.returncode != 0
    assert f"Signal {int(signal.SIGKILL)} (SIGKILL)" in result.output
    assert_no_worker_left(tmp_path, 2)
    report_stop_latency(tmp_path, result, 1)


def test_a_stalled_rank_is_named_with_where_everyone_waits(tmp_path):
    result = run_job(tmp_path, "stuck", 3, env={"TEST_STUCK_TIMEOUT": "2"})
    assert result.returncode != 0
    headline = re.search(
        rf"rank 2 is at script\.py:{line_of('# SLEEPING')} \(not in a collective[^\n]*\n"
        rf"\s+ranks 0, 1 wait in gather #\d+ at script\.py:{line_of('# GATHER-STEP')} with float32\[1\], "
        r"for ([\d.]+)(?:-[\d.]+)? s",  # a range when their waits differ
        result.output,
    )
    assert headline, result.output
    assert "rank 2 did not join gather" in result.output and "stuck timeout of 2 s" in result.output
    assert_no_worker_left(tmp_path, 3)
    print(f"report after {headline.group(1)} s of waiting (stuck timeout 2 s)")


def test_mismatched_collectives_raise_the_same_clear_error_on_every_rank(tmp_path):
    result = run_job(tmp_path, "mismatch", 2, env={"CADENCE_HANDSHAKE": "1"})
    assert result.returncode == 0, result.output
    for rank in range(2):
        ops = (tmp_path / f"ops.rank{rank}.txt").read_text()
        assert ops.startswith(f"[rank {rank}] Cannot run {'gather' if rank == 0 else 'reduce'}")
        assert "the ranks called different collectives" in ops
        assert re.search(r"rank 0: gather float32\[2, 3\] \(call #1 at script\.py:\d+\)", ops)
        assert re.search(r"rank 1: reduce float32\[2, 3\] with reduction='sum' \(call #1", ops)
        shapes = (tmp_path / f"shapes.rank{rank}.txt").read_text()
        assert "the ranks passed incompatible inputs" in shapes
        assert "rank 0: gather {'x': float32[2, 3]}" in shapes
        assert "rank 1: gather {'x': float32[2, 4]}" in shapes
        # The group still works afterwards.
        assert (tmp_path / f"after.rank{rank}.txt").read_text() == "[0, 1]"


def test_diverged_collectives_without_a_pre_check_are_reported_instead_of_hanging(tmp_path):
    result = run_job(tmp_path, "no_handshake", 2)
    assert result.returncode != 0
    assert "the ranks called different collectives as call #1" in result.output
    assert f"gather #1 at script.py:{line_of('# GATHER')}" in result.output
    assert f"reduce #1 at script.py:{line_of('# REDUCE')}" in result.output
    assert_no_worker_left(tmp_path, 2)
