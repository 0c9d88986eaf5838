"""`cadence launch` for real: processes started through the CLI in a subprocess (each test costs seconds)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

CADENCE = [sys.executable, "-m", "cadence.commands.cli"]


def cli_env(tmp_path: Path) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("CADENCE_", "TORCHELASTIC_", "PET_"))
    }
    for name in (
        "RANK",
        "WORLD_SIZE",
        "LOCAL_RANK",
        "MASTER_ADDR",
        "MASTER_PORT",
        "OMP_NUM_THREADS",
    ):
        env.pop(name, None)
    env["HF_HOME"] = str(tmp_path / "hf")
    env["CUDA_VISIBLE_DEVICES"] = (
        ""  # these launches start CPU workers (gloo), also on a GPU machine
    )
    return env


def launch(tmp_path: Path, *args: str, timeout: float = 180) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*CADENCE, "launch", *args],
        cwd=tmp_path,
        env=cli_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def write_script(tmp_path: Path, name: str, body: str) -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(body))
    return path


def test_cpu_machine_starts_four_gloo_processes(tmp_path):
    write_script(
        tmp_path,
        "report.py",
        """
        import json, os, sys
        import torch
        torch.set_num_threads(1)
        from cadence import PartialState
        from cadence.core.settings import read_launch_config

        state = PartialState()
        record = read_launch_config()
        out = {"rank": state.process_index, "world": state.num_processes, "backend": state.backend,
               "planned": record["num_processes"], "args": sys.argv[1:], "omp": os.environ["OMP_NUM_THREADS"]}
        with open(f"rank{state.process_index}.json", "w") as handle:
            json.dump(out, handle)
        state.wait_for_everyone()
        """,
    )
    result = launch(
        tmp_path,
        "--num_processes",
        "4",
        "--num_cpu_threads_per_process",
        "1",
        "report.py",
        "--x",
        "1",
    )
    assert result.returncode == 0, result.stderr
    reports = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(4)]
    assert sorted(r["rank"] for r in reports) == [0, 1, 2, 3]
    assert {(r["world"], r["backend"], r["planned"], r["omp"]) for r in reports} == {
        (4, "gloo", 4, "1")
    }
    assert all(r["args"] == ["--x", "1"] for r in reports)
    assert "4 (4 per machine)" in result.stderr and "[flag]" in result.stderr


def test_failing_worker_gives_root_cause_summary(tmp_path):
    write_script(
        tmp_path,
        "fails.py",
        """
        import torch
        import torch.distributed as dist
        torch.set_num_threads(1)
        dist.init_process_group("gloo")

        def load_batch(index):
            if dist.get_rank() == 1:
                raise ValueError(f"corrupt batch {index}")

        load_batch(7)
        dist.barrier()
        """,
    )
    result = launch(tmp_path, "--num_processes", "2", "fails.py")
    assert result.returncode == 1
    summary = result.stderr[result.stderr.index("cadence launch: rank") :]
    first, second = summary.splitlines()[:2]
    assert first.startswith("cadence launch: rank 1 failed (exit code 1)")
    assert second.strip() == "ValueError: corrupt batch 7"
    assert "in load_batch" in summary  # the last traceback lines point at the user's code
    assert "rank 0: stopped because rank 1 failed" in summary


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return False
    return "\nState:\tZ" not in state  # a zombie has already exited


def _wait_for(condition, limit: float = 60.0) -> bool:
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.1)
    return condition()


@pytest.mark.parametrize("stop_signal", [signal.SIGTERM])
def test_signal_to_launcher_stops_every_worker(tmp_path, stop_signal):
    write_script(
        tmp_path,
        "sleeps.py",
        """
        import os, time
        with open(f"pid{os.environ['RANK']}", "w") as handle:
            handle.write(str(os.getpid()))
        time.sleep(300)
        """,
    )
    launcher = subprocess.Popen(
        [*CADENCE, "launch", "--quiet", "--num_processes", "2", "sleeps.py"],
        cwd=tmp_path,
        env=cli_env(tmp_path),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        pid_files = [tmp_path / "pid0", tmp_path / "pid1"]
        assert _wait_for(lambda: all(p.exists() and p.read_text() for p in pid_files)), (
            "workers never started"
        )
        workers = [int(p.read_text()) for p in pid_files]
        launcher.send_signal(stop_signal)
        _, stderr = launcher.communicate(timeout=120)
        assert launcher.returncode == 128 + stop_signal
        assert "stopped by SIGTERM" in stderr
        assert _wait_for(lambda: not any(_alive(pid) for pid in workers)), "orphaned workers"
    finally:
        if launcher.poll() is None:
            launcher.kill()


def test_single_process_runs_directly_and_keeps_exit_code(tmp_path):
    write_script(
        tmp_path,
        "single.py",
        """
        import json, os, sys
        record = json.loads(os.environ["CADENCE_LAUNCH_CONFIG"])
        print("RESULT", record["num_processes"], record["mixed_precision"], sys.argv[1:], os.environ["RANK"])
        sys.exit(int(sys.argv[1]))
        """,
    )
    ok = launch(tmp_path, "--mixed_precision", "bf16", "single.py", "0", "--flag")
    assert ok.returncode == 0, ok.stderr
    assert "RESULT 1 bf16 ['0', '--flag'] 0" in ok.stdout
    failed = launch(tmp_path, "--quiet", "single.py", "3")
    assert failed.returncode == 3
    assert "cadence launch: rank 0 failed (exit code 3)" in failed.stderr
    assert "no Python exception was recorded" in failed.stderr


def test_module_mode_runs_a_module_from_the_working_directory(tmp_path):
    package = tmp_path / "mypkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "train.py").write_text("import sys\nprint('MODULE', __name__, sys.argv[1:])\n")
    result = launch(tmp_path, "-q", "-m", "mypkg.train", "--a", "b")
    assert result.returncode == 0, result.stderr
    assert "MODULE __main__ ['--a', 'b']" in result.stdout


def test_max_restarts_restarts_the_group_after_a_failure(tmp_path):
    write_script(
        tmp_path,
        "flaky.py",
        """
        import os
        attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
        with open(f"attempt{attempt}-rank{os.environ['RANK']}", "w"):
            pass
        if attempt == 0 and os.environ["RANK"] == "1":
            raise RuntimeError("first attempt fails")
        """,
    )
    result = launch(tmp_path, "-q", "--num_processes", "2", "--max_restarts", "1", "flaky.py")
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "attempt1-rank0").exists() and (tmp_path / "attempt1-rank1").exists()


def test_a_restarted_group_joins_a_new_process_group(tmp_path):
    """Each attempt joins a gloo group through the agent's store; attempt 0's ranks die (SIGKILL)
    after it formed. Attempt 1 must form its own group, not read attempt 0's rank addresses: torch
    2.13 dropped the per-attempt key prefix while the static rendezvous keeps one store (the
    restarted ranks failed in gloo's connectFullMesh with 'Connection refused')."""
    write_script(
        tmp_path,
        "rejoin.py",
        """
        import os, signal, time
        from cadence import Accelerator
        accelerator = Accelerator(cpu=True)
        accelerator.wait_for_everyone()
        attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
        if attempt == 0:
            time.sleep(0.5)  # both ranks wrote their addresses: a later attempt could read them
            os.kill(os.getpid(), signal.SIGKILL)
        print("JOINED", attempt, accelerator.process_index, flush=True)
        """,
    )
    result = launch(tmp_path, "-q", "--num_processes", "2", "--max_restarts", "1", "rejoin.py")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "JOINED 1 0" in result.stdout and "JOINED 1 1" in result.stdout


def test_no_python_runs_an_executable(tmp_path):
    result = launch(tmp_path, "-q", "--no_python", "sh", "-c", 'echo "NOPY $RANK $WORLD_SIZE"')
    assert result.returncode == 0, result.stderr
    assert "NOPY 0 1" in result.stdout


def test_lines_printed_by_several_ranks_stay_whole(tmp_path):
    """Workers share the launcher's stdout: every line a rank prints arrives whole, never glued to
    another rank's (a print under `python -u` used to be two writes, text then newline)."""
    write_script(
        tmp_path,
        "chatty.py",
        """
        import os
        rank = os.environ["RANK"]
        for i in range(1500):
            print(f"rank {rank} line {i}")
        """,
    )
    result = launch(tmp_path, "--cpu", "--quiet", "--num_processes", "2", "chatty.py")
    assert result.returncode == 0, result.stderr[-2000:]
    lines = result.stdout.splitlines()
    expected = {f"rank {rank} line {i}" for rank in (0, 1) for i in range(1500)}
    assert sorted(lines) == sorted(expected)
