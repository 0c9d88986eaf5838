"""A worker that finished its script exits with the script's status, every time (issue 33, item 3).

torch's DDP keeps the gloo process group alive in native code after `destroy_process_group`, and its
threads used to meet a finalizing interpreter now and then (SIGABRT, "terminate called without an
active exception", after training had finished). The worker bootstrap now runs the interpreter's
shutdown steps itself and ends before finalization; these tests check that it still behaves as
`python script.py` at exit, and that the demo exits 0 under CPU load, run after run.

The long form (30 runs of the full demo) is opt-in: `make test-exit`, or CADENCE_EXIT_RUNS=30. The
suite's single run trains one epoch (`--epochs 1`) instead of eight: the exit path is the same (the
last collective, end_training, the shutdown steps), and under load each step costs a scheduling round
trip, so eight epochs kept both cores busy for up to two minutes beside the other xdist worker.
"""

from __future__ import annotations

import multiprocessing
import os
import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEMO = REPO / "examples" / "train_regression.py"
RUNS = int(os.environ.get("CADENCE_EXIT_RUNS", "1"))
DEMO_ARGS = [] if RUNS > 1 else ["--epochs", "1"]  # the long form runs the demo as users do


def _launch(*args: str, cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "cadence.commands.cli", "launch", "--cpu", "--quiet", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_worker_exit_keeps_what_python_does_at_exit(tmp_path):
    """Exit status, atexit handlers, a non-daemon thread, an unclosed file: as under `python`."""
    script = tmp_path / "ending.py"
    script.write_text(
        textwrap.dedent(
            """
            import atexit, os, sys, threading, time
            import torch.distributed  # the workers this concerns have it loaded
            rank = os.environ.get("RANK", "0")
            log = open(f"unclosed-{rank}.txt", "w")  # never closed: shutdown must flush it
            log.write("written before exit")
            atexit.register(lambda: open(f"atexit-{rank}.txt", "w").write("ran"))
            def late():
                time.sleep(0.5)
                open(f"thread-{rank}.txt", "w").write("finished")
            threading.Thread(target=late).start()  # not a daemon: exit waits for it
            sys.exit(int(sys.argv[1]))
            """
        )
    )
    result = _launch(str(script), "3", cwd=tmp_path)
    assert result.returncode == 3, result.stderr
    for name in ("unclosed-0.txt", "atexit-0.txt", "thread-0.txt"):
        assert (tmp_path / name).read_text() in ("written before exit", "ran", "finished"), name
    result = _launch("--num_processes", "2", str(script), "0", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "unclosed-1.txt").read_text() == "written before exit"
    assert (tmp_path / "atexit-1.txt").read_text() == "ran"
    assert (tmp_path / "thread-1.txt").read_text() == "finished"


def _spin(stop) -> None:  # one busy core, until told to stop
    while not stop.is_set():
        sum(range(10_000))


def test_demo_exits_zero_under_load(tmp_path):
    """The README's demo on two processes with both cores busy: exit 0 on every run."""
    stop = multiprocessing.Event()
    load = [multiprocessing.Process(target=_spin, args=(stop,), daemon=True) for _ in range(2)]
    for process in load:
        process.start()
    failures = []
    try:
        for run in range(RUNS):
            result = _launch(
                "--num_processes", "2", str(DEMO), *DEMO_ARGS, cwd=tmp_path, timeout=600
            )
            if result.returncode != 0 or "learned weights" not in result.stdout:
                failures.append(f"run {run}: exit {result.returncode}\n{result.stderr[-2000:]}")
    finally:
        stop.set()
        for process in load:
            process.join(10)
    assert not failures, f"{len(failures)} of {RUNS} runs failed:\n" + "\n".join(failures)


# Two real processes on gloo. Rank 0 leaves an all_reduce that rank 1 never joins, its tensor
# already dropped by Python (so the gloo worker needs the GIL to free it), and then destroys the
# group as Cadence does at exit: once with the path of the installed torch, once with the fallback
# for torch < 2.8 (which holds the backends and drops them last). Before that fallback, torch 2.6
# hung in the group's destructor every time here (the gloo worker waited for the GIL).
_PENDING_WORK_AT_DESTROY = textwrap.dedent(
    """
    import datetime, os, sys, time
    import torch, torch.distributed as dist
    from cadence.runtime import process_group

    rank, out = int(sys.argv[1]), sys.argv[2]
    for round, fallback in enumerate((False, True)):
        store = dist.FileStore(os.path.join(out, f"store{round}"), 2)
        dist.init_process_group(
            "gloo", store=store, rank=rank, world_size=2, timeout=datetime.timedelta(seconds=2)
        )
        dist.barrier()
        done = os.path.join(out, f"done{round}")
        if rank == 0:
            dist.all_reduce(torch.ones(1), async_op=True)  # never joined by rank 1
            if fallback:
                process_group.group_destructor_releases_gil = lambda: False
            process_group.destroy_default_group()
            open(done, "w").close()
        else:
            for _ in range(1200):  # bounded: the parent's timeout ends a hang first
                if os.path.exists(done):
                    break
                time.sleep(0.05)
            dist.destroy_process_group()
    print(f"rank {rank} ended", flush=True)
    """
)


def test_destroying_the_group_with_a_collective_left_pending_ends(tmp_path):
    """destroy_default_group returns, on the installed torch's path and on the fallback for < 2.8,
    while a gloo worker still holds a collective whose tensors only it references (cpu=True)."""
    script = tmp_path / "pending.py"
    script.write_text(_PENDING_WORK_AT_DESTROY)
    env = dict(os.environ, OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="")
    ranks = [
        subprocess.Popen(
            [sys.executable, str(script), str(rank), str(tmp_path)],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
        )
        for rank in range(2)
    ]
    outputs = []
    try:
        for rank, process in enumerate(ranks):
            output, _ = process.communicate(timeout=120)
            outputs.append(output)
            assert process.returncode == 0, f"rank {rank}:\n{output}"
            assert f"rank {rank} ended" in output
    finally:
        for process in ranks:
            if process.poll() is None:
                process.kill()
                process.communicate()
    assert (tmp_path / "done0").exists() and (tmp_path / "done1").exists(), outputs
