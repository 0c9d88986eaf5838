"""How long an elastic job stops training when its membership changes: two local "nodes" (two
launchers on 127.0.0.1, `--nnodes 1:2`, c10d rendezvous, one CPU process each).

Events, each timed from the event to the first training step at the new world size:
- node death: node b's launcher and workers are SIGKILLed;
- stop notice: node b's launcher gets SIGTERM (Cadence: a checkpoint is committed first, also timed);
- node join: node b starts while node a trains alone.

Setups: plain `torchrun` with torch's rendezvous defaults, plain `torchrun` with the tuned settings
Cadence uses by default, and `cadence launch` (a Cadence script: Accelerator, graceful stop).

    python benchmarks/bench_elastic_restart.py [--repeats 1] [--events death,notice,join]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

WORKER = textwrap.dedent(
    """
    import json, os, sys, time
    import torch
    import torch.distributed as dist
    project = sys.argv[1]
    os.makedirs(project, exist_ok=True)
    if os.environ.get("MODE") == "cadence":
        from cadence import Accelerator
        from cadence.utils import ProjectConfiguration
        acc = Accelerator(cpu=True, project_config=ProjectConfiguration(
            project_dir=project, automatic_checkpoint_naming=True, total_limit=2))
        model = torch.nn.Linear(4, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        model, opt = acc.prepare(model, opt)
        if os.path.isdir(os.path.join(project, "checkpoints")):
            acc.load_state()
        rank, world = acc.process_index, acc.num_processes
        loader = acc.prepare_data_loader(torch.utils.data.DataLoader(list(range(100000)), batch_size=1))
        def step(batch):
            acc.backward(model(batch.float().view(-1, 1).expand(-1, 4)).sum())
            opt.step(); opt.zero_grad()
    else:
        dist.init_process_group("gloo")
        rank, world = dist.get_rank(), dist.get_world_size()
        model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 1))
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        loader = range(100000)
        def step(batch):
            model(torch.ones(1, 4)).sum().backward()
            opt.step(); opt.zero_grad()
    log = open(os.path.join(project, f"log-{os.getpid()}.jsonl"), "a")
    for batch in loader:
        step(batch)
        if rank == 0:
            log.write(json.dumps({"world": world, "time": time.time()}) + "\\n"); log.flush()
        time.sleep(0.2)
    """
)
TUNED = "keep_alive_interval=1,keep_alive_max_attempt=3,last_call_timeout=2"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def command(setup: str, port: int, script: Path, project: Path) -> list[str]:
    common = ["--nnodes", "1:2", "--nproc_per_node", "1", "--max_restarts", "5",
              "--rdzv_backend", "c10d", "--rdzv_endpoint", f"127.0.0.1:{port}"]  # fmt: skip
    if setup == "cadence launch":
        return [sys.executable, "-m", "cadence.commands.cli", "launch", "--cpu", "-q", *common,
                str(script), str(project)]  # fmt: skip
    tuned = ["--rdzv_conf", TUNED] if setup == "torchrun, tuned" else []
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        *common,
        *tuned,
        str(script),
        str(project),
    ]


def steps(project: Path) -> list[dict]:
    records = []
    for path in project.glob("log-*.jsonl"):
        records += [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return sorted(records, key=lambda r: r["time"])


def wait(condition, limit: float) -> bool:
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:  # bounded
        if condition():
            return True
        time.sleep(0.05)
    return False


def descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def kill_tree(process: subprocess.Popen) -> None:
    for pid in [process.pid, *descendants(process.pid)]:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    process.wait(timeout=30)


def one_run(setup: str, event: str, workdir: Path) -> dict[str, float | None]:
    project, script, port = workdir / "project", workdir / "worker.py", free_port()
    script.write_text(WORKER)
    # The shared-store switch for plain torchrun too: without it, when the node whose agent hosts
    # the workers' store (rank 0's) dies, the survivors' new round waits on that dead store.
    env = {**os.environ, "MODE": "cadence" if setup == "cadence launch" else "plain",
           "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1",
           "CADENCE_JOB_TOKEN": "0f1e2d3c4b5a69788796a5b4c3d2e1f0", "CUDA_VISIBLE_DEVICES": ""}  # fmt: skip
    out = open(workdir / "out.txt", "w")  # noqa: SIM115
    start = lambda: subprocess.Popen(command(setup, port, script, project), env=env,  # noqa: E731
                                     stdout=out, stderr=subprocess.STDOUT)  # fmt: skip
    a = start()
    b = None
    try:
        wait(lambda: port_open(port), 60)
        if event == "join":
            wait(lambda: len(steps(project)) >= 3, 120)
            t0 = time.time()
            b = start()
            new_size = 2
        else:
            b = start()
            if not wait(lambda: sum(r["world"] == 2 for r in steps(project)) >= 3, 180):
                return {"to first step": None}
            t0 = time.time()
            if event == "death":
                kill_tree(b)
            else:
                b.send_signal(signal.SIGTERM)
            new_size = 1
        wait(lambda: any(r["time"] > t0 and r["world"] == new_size for r in steps(project)), 150)
        after = [r["time"] for r in steps(project) if r["time"] > t0 and r["world"] == new_size]
        result = {"to first step": after[0] - t0 if after else None}
        ckpts = list((project / "checkpoints").glob("checkpoint_*")) if event == "notice" else []
        if ckpts:
            result["to checkpoint"] = max(p.stat().st_mtime for p in ckpts) - t0
        return result
    finally:
        for process in (a, b):
            if process is not None and process.poll() is None:
                kill_tree(process)
        out.close()


def port_open(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.3)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--events", default="death,notice,join")
    parser.add_argument(
        "--setups", default="torchrun, torch defaults;torchrun, tuned;cadence launch"
    )
    options = parser.parse_args()
    for event in options.events.split(","):
        for setup in options.setups.split(";"):
            results = []
            for _ in range(options.repeats):
                with tempfile.TemporaryDirectory(prefix="bench-elastic-") as workdir:
                    results.append(one_run(setup, event, Path(workdir)))
            firsts = [r["to first step"] for r in results if r["to first step"] is not None]
            text = f"{statistics.median(firsts):6.1f} s" if firsts else "  none"
            ckpt = [r["to checkpoint"] for r in results if "to checkpoint" in r]
            extra = f" (checkpoint committed after {statistics.median(ckpt):.1f} s)" if ckpt else ""
            print(f"{event:7s} {setup:26s} first step at the new size after {text}{extra} "
                  f"[{len(firsts)}/{len(results)} runs]", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
