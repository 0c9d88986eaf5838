"""How long an elastic job stops training when its membership changes: two local "nodes" (two
launchers on 127.0.0.1, `--nnodes 1:2`, c10d rendezvous, one CPU process each).

Events, each timed from the event to the first training step at the new world size:
- node death: node b's launcher and workers are SIGKILLed;
- stop notice: node b's launcher gets SIGTERM (Cadence: a checkpoint is committed first, also timed);
- node join: node b starts while node a trains alone.

Setups: plain `torchrun` with torch's rendezvous defaults, plain `torchrun` with the tuned settings
Cadence uses by default, and `cadence launch` (a Cadence script: Accelerator, graceful stop;
`cadence launch@SRC` runs another Cadence source tree, e.g. an older commit, for a before/after).
The setups run interleaved (each repeat runs every setup in turn). Each run prints where the time
went: when the first worker process at the new size started, finished importing, initialised and
stepped, in seconds after the event; `--keep DIR` keeps each run's folder with the launchers'
output, each line with its wall-clock time.

    python benchmarks/bench_elastic_restart.py --repeats 2 --events death,notice,join
    python benchmarks/bench_elastic_restart.py --setups "torchrun, tuned;cadence launch"

Measured (2-core machine shared with other jobs, medians of 2 runs each; torch 2.13 CPU):

| event | torchrun, tuned | Cadence before | Cadence now | load average |
| --- | --- | --- | --- | --- |
| node death | 8.1 s | 9.8 s | 8.3 s | 3-4 |
| stop notice (checkpoint committed) | 8.0 s (none) | 11.9 s (1.9 s) | 5.9 s (0.8 s) | 3-4 |
| node join | 7.3 s | 9.9 s | 8.4 s | 3-4 |
| node death | 10.0 s | 13.7 s | 8.6 s | 5-6 |
| stop notice (checkpoint committed) | 11.2 s (none) | 17.3 s (1.6 s) | 12.4 s (0.9 s) | 7-11 |
| node join | 13.5 s | 14.4 s | 9.7 s | 6-11 |
| node death | 7.1 s | | 6.8 s | 0.6-1 (quiet) |
| stop notice (checkpoint committed) | 7.2 s (none) | | 5.2 s (0.9 s) | 0.6-1 (quiet) |
| node join | 5.2 s | | 5.7 s | 0.6-1 (quiet) |

The command above with its default setups, load average falling from 7 to 1 during the run (medians
of 2): death 49.1 s (torch defaults) / 12.0 s (tuned) / 10.8 s (Cadence); notice 45.4 / 6.9 / 5.0 s
(Cadence's checkpoint committed after 0.8 s); join 5.5 / 6.2 / 6.4 s.

"Before" is the commit before the noticed node left the rendezvous and workers ended right after the
checkpoint (the previous figure, 19 s after a death under load 15, was that code). torch's defaults
took 47-54 s after a death. Under load most of what is left is the new worker's start (Python,
`import torch`, the optimizer's first import of torch._dynamo: 2.5 s on a quiet machine, 5-8 s at
load 10), the same for torchrun; the rendezvous itself takes ~2 s after a notice (the 2-s last call)
and ~5 s after a death (3 missed 1-s heartbeats, then the last call).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from pathlib import Path

WORKER = textwrap.dedent(
    """
    import json, os, sys, time
    def started():
        # This process's start (the kernel's clock ticks since boot), as a wall-clock time.
        ticks = int(open("/proc/self/stat").read().rsplit(")", 1)[1].split()[19])
        boot = next(int(l.split()[1]) for l in open("/proc/stat") if l.startswith("btime"))
        return boot + ticks / os.sysconf("SC_CLK_TCK")
    phases = {"process": started(), "python": time.time()}
    import torch
    import torch.distributed as dist
    phases["import torch"] = time.time()
    project = sys.argv[1]
    os.makedirs(project, exist_ok=True)
    if os.environ.get("MODE") == "cadence":
        from cadence import Accelerator
        from cadence.utils import ProjectConfiguration
        phases["import cadence"] = time.time()
        acc = Accelerator(cpu=True, project_config=ProjectConfiguration(
            project_dir=project, automatic_checkpoint_naming=True, total_limit=2))
        phases["init"] = time.time()
        model = torch.nn.Linear(4, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        model, opt = acc.prepare(model, opt)
        if os.path.isdir(os.path.join(project, "checkpoints")):
            acc.load_state()
        phases["load state"] = time.time()
        rank, world = acc.process_index, acc.num_processes
        loader = acc.prepare_data_loader(torch.utils.data.DataLoader(list(range(100000)), batch_size=1))
        def step(batch):
            acc.backward(model(batch.float().view(-1, 1).expand(-1, 4)).sum())
            opt.step(); opt.zero_grad()
    else:
        dist.init_process_group("gloo")
        phases["init"] = time.time()
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
            record = {"world": world, "time": time.time()}
            if phases:
                record["phases"], phases = phases, None
            log.write(json.dumps(record) + "\\n"); log.flush()
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
    if setup.startswith("cadence launch"):
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


def timestamp_lines(stream, out, name: str) -> None:
    for raw in iter(stream.readline, b""):  # bounded: ends when the launcher's output closes
        out.write(f"{time.time():.3f} [{name}] {raw.decode(errors='replace').rstrip()}\n")
        out.flush()


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
    cadence = setup.startswith("cadence launch")
    env = {**os.environ, "MODE": "cadence" if cadence else "plain",
           "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1",
           "CADENCE_JOB_TOKEN": "0f1e2d3c4b5a69788796a5b4c3d2e1f0", "CUDA_VISIBLE_DEVICES": ""}  # fmt: skip
    if cadence and "@" in setup:  # "cadence launch@/path/to/src": another Cadence source tree
        env["PYTHONPATH"] = setup.split("@", 1)[1]
    out = open(workdir / "out.txt", "w")  # noqa: SIM115
    readers: list[threading.Thread] = []

    def start(name: str) -> subprocess.Popen:
        process = subprocess.Popen(command(setup, port, script, project), env=env,
                                   stdout=subprocess.PIPE, stderr=subprocess.STDOUT)  # fmt: skip
        # Each line of the launchers' output with its wall-clock time (the timeline, with --keep).
        reader = threading.Thread(target=timestamp_lines, args=(process.stdout, out, name))
        reader.start()
        readers.append(reader)
        return process

    a = start("a")
    b = None
    try:
        wait(lambda: port_open(port), 60)
        if event == "join":
            wait(lambda: len(steps(project)) >= 3, 120)
            t0 = time.time()
            out.write(f"{t0:.3f} [bench] join\n")
            b = start("b")
            new_size = 2
        else:
            b = start("b")
            if not wait(lambda: sum(r["world"] == 2 for r in steps(project)) >= 3, 180):
                return {"to first step": None}
            t0 = time.time()
            out.write(f"{t0:.3f} [bench] {event}\n")
            if event == "death":
                kill_tree(b)
            else:
                b.send_signal(signal.SIGTERM)
            new_size = 1
        wait(lambda: any(r["time"] > t0 and r["world"] == new_size for r in steps(project)), 150)
        after = [r for r in steps(project) if r["time"] > t0 and r["world"] == new_size]
        result = {"to first step": after[0]["time"] - t0 if after else None}
        # Where the time went: the first worker process at the new size, phase by phase.
        first = next((r for r in after if r.get("phases")), None)
        if first is not None:
            marks = sorted(first["phases"].items(), key=lambda item: item[1])
            result["phases"] = {name: at - t0 for name, at in marks}
            result["phases"]["first step"] = first["time"] - t0
        ckpts = list((project / "checkpoints").glob("checkpoint_*")) if event == "notice" else []
        if ckpts:
            result["to checkpoint"] = max(p.stat().st_mtime for p in ckpts) - t0
        return result
    finally:
        for process in (a, b):
            if process is not None and process.poll() is None:
                kill_tree(process)
        for reader in readers:
            reader.join(timeout=10)
        out.close()


def port_open(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.3)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def _median(values: list[float]) -> str:
    return f"{statistics.median(values):5.1f} s" if values else "   none"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--events", default="death,notice,join")
    parser.add_argument(
        "--setups",
        default="torchrun, torch defaults;torchrun, tuned;cadence launch",
        help="';'-separated; 'cadence launch@SRC' runs the Cadence source tree SRC",
    )
    parser.add_argument("--keep", default="", help="copy each run's folder (timeline) here")
    options = parser.parse_args()
    setups = options.setups.split(";")
    print(f"load average before: {os.getloadavg()[0]:.1f} (cores: {os.cpu_count()})", flush=True)
    results: dict[tuple[str, str], list[dict]] = {}
    for event in options.events.split(","):
        for repeat in range(options.repeats):
            for setup in setups:  # interleaved: each repeat runs every setup once, in turn
                with tempfile.TemporaryDirectory(prefix="bench-elastic-") as workdir:
                    result = one_run(setup, event, Path(workdir))
                    if options.keep:
                        name = f"{event}-{setup.replace(' ', '').replace('/', '_')}-{repeat}"
                        shutil.copytree(workdir, Path(options.keep) / name)
                results.setdefault((event, setup), []).append(result)
                phases = ", ".join(f"{k} {v:.1f}" for k, v in result.get("phases", {}).items())
                first = result["to first step"]
                print(f"  {event} / {setup} #{repeat + 1}: "
                      f"{'none' if first is None else f'{first:.1f} s'}"
                      f" (seconds after the event: {phases or 'no step at the new size'})"
                      f" load {os.getloadavg()[0]:.1f}", flush=True)  # fmt: skip
    print(f"\nload average after: {os.getloadavg()[0]:.1f}")
    header = ("event", "setup", "to first step", "to checkpoint", "runs")
    print(f"{header[0]:7s} | {header[1]:24s} | {header[2]:13s} | {header[3]:13s} | {header[4]}")
    print("-" * 75)
    for (event, setup), runs in results.items():
        firsts = [r["to first step"] for r in runs if r["to first step"] is not None]
        ckpts = [r["to checkpoint"] for r in runs if "to checkpoint" in r]
        ckpt = _median(ckpts) if ckpts else ""
        print(f"{event:7s} | {setup[:24]:24s} | {_median(firsts):>13s} | {ckpt:>13s} | "
              f"{len(firsts)}/{len(runs)}")  # fmt: skip
    print("(medians; seconds from the event to the first training step at the new world size,")
    print(" and for a notice to the checkpoint's commit)")


if __name__ == "__main__":
    main()
