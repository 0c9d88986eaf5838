"""Helpers of the elastic launch tests: two `cadence launch` processes on 127.0.0.1 as two "nodes".

The training script logs, after each step, the samples the whole job trained in it (gathered) from
each of its loaders, so a test can check that every sample of every epoch was trained exactly once
across restarts. It resumes with `load_state`: the prepared loaders' own positions continue the epoch
at the new world size.

Start orders: "host-first" starts the node that hosts the rendezvous store first, without `is_host`
(the local nodes' rule: the first launcher on the port hosts it); "non-host-first" starts the other
node first, told `is_host=0`, and the host after it, told `is_host=1` (issue 32, case 3).
"""

from __future__ import annotations

import collections
import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

CADENCE = [sys.executable, "-m", "cadence.commands.cli"]
JOB_TOKEN = "5f0c1d2e3a4b5c6d7e8f90a1b2c3d4e5f60718293a4b5c6d"

# The loaders a job trains from, side by side (one launch checks both): the default shuffled
# DataLoader (RandomSampler) and a sequential one.
LOADERS = ("shuffled", "sequential")

TRAIN_SCRIPT = textwrap.dedent(
    """
    import json, os, sys, time
    import torch
    torch.set_num_threads(1)
    from cadence import Accelerator
    from cadence.utils import ProjectConfiguration

    project, epochs, n = sys.argv[1], 2, int(os.environ.get("SAMPLES", "32"))
    loaders = os.environ.get("LOADERS", "shuffled,sequential").split(",")
    os.makedirs(project, exist_ok=True)
    # Seconds each step sleeps: at world size 2, and alone (so that a join or a notice lands mid-run
    # while the rest of the run goes fast).
    step_sleep = float(os.environ.get("STEP_SLEEP", "0.3"))
    alone_sleep = float(os.environ.get("STEP_SLEEP_ALONE", str(step_sleep)))
    if (os.environ.get("START_TOGETHER") and os.environ["WORLD_SIZE"] == "1"
            and not os.path.isdir(os.path.join(project, "checkpoints"))):
        # The first round formed before the other node's launcher was up: wait (bounded) for the
        # restart that its joining brings, so that the job starts at world size 2.
        print("alone in the first round: waiting for the other node", flush=True)
        time.sleep(240)
        sys.exit("the other node never joined")

    class Progress:
        def __init__(self):
            self.epoch, self.done = 0, 0  # samples of this epoch trained by the whole job
            self.steps = 0  # steps the job trained
        def state_dict(self):
            return {"epoch": self.epoch, "done": self.done, "steps": self.steps}
        def load_state_dict(self, state):
            self.epoch, self.done, self.steps = state["epoch"], state["done"], state["steps"]

    config = ProjectConfiguration(project_dir=project, automatic_checkpoint_naming=True, total_limit=3)
    acc = Accelerator(cpu=True, project_config=config)
    torch.manual_seed(0)
    model = torch.nn.Linear(1, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    # A global batch of 4 samples per step whatever the world size (4 // world per rank); the
    # loaders' own positions (in samples of the epoch) resume the epoch on any world size.
    per_rank = 4 // acc.num_processes
    built = [torch.utils.data.DataLoader(list(range(n)), batch_size=per_rank,
                                         shuffle=name == "shuffled") for name in loaders]
    model, opt, *prepared = acc.prepare(model, opt, *built)
    progress = Progress()
    acc.register_for_checkpointing(progress)
    # SAVE_EVERY=k: a checkpoint every k steps (a killed node's job resumes from the last one).
    save_every = int(os.environ.get("SAVE_EVERY", "0"))
    log = open(os.path.join(project, f"log-{acc.process_index}-{os.getpid()}.jsonl"), "a")

    def note(kind):  # the main process's record of a resume or a save (no samples)
        if acc.is_main_process:
            record = {"kind": kind, "step": progress.steps, "world": acc.num_processes,
                      "time": time.time()}
            log.write(json.dumps(record) + "\\n")
            log.flush()

    if os.path.isdir(os.path.join(project, "checkpoints")):
        acc.load_state()
        note("resumed")
        if acc.is_main_process:
            print(f"resumed at epoch {progress.epoch} after {progress.done} samples, "
                  f"world size {acc.num_processes}", flush=True)
    while progress.epoch < epochs:
        for batches in zip(*prepared):
            trained = {name: acc.gather(b.clone()).tolist() for name, b in zip(loaders, batches)}
            x = torch.cat(batches).float().unsqueeze(1)
            loss = model(x).pow(2).mean()
            acc.backward(loss)
            opt.step()
            opt.zero_grad()
            progress.done += len(trained[loaders[0]])
            progress.steps += 1
            if acc.is_main_process:
                record = {"epoch": progress.epoch, "samples": trained, "world": acc.num_processes,
                          "step": progress.steps, "time": time.time()}
                log.write(json.dumps(record) + "\\n")
                log.flush()
            if save_every and progress.steps % save_every == 0:
                acc.save_state()
                note("saved")
            time.sleep(step_sleep if acc.num_processes > 1 else alone_sleep)
        progress.epoch += 1
        progress.done = 0
    acc.save_state()  # the finished state: a restart after the end has nothing left to do
    if acc.is_main_process:
        print("finished", flush=True)
    """
)


def node_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    """The environment of one launcher: no inherited launch variables, CPU workers, a shared token."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("CADENCE_", "TORCHELASTIC_", "PET_", "TORCH_DISABLE_SHARE"))
        and k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
    }
    env.update(CUDA_VISIBLE_DEVICES="", HF_HOME=str(tmp_path / "hf"), CADENCE_JOB_TOKEN=JOB_TOKEN)
    env.update(extra)
    return env


def start_node(
    tmp_path: Path,
    port: int,
    name: str,
    script: Path,
    *flags: str,
    own_session: bool = False,
    quiet: bool = True,
    **env: str,
) -> subprocess.Popen:
    """One "node": `cadence launch --nnodes 1:2 ...` on 127.0.0.1:`port`, output in `name`.out.

    `own_session`: the launcher leads its own process group, so `kill_node` can end it whole.
    `quiet=False`: the launcher prints its banner (the sign that it is about to meet the rendezvous)."""
    out = open(tmp_path / f"{name}.out", "w")  # noqa: SIM115 - closed with the process
    command = [
        *CADENCE, "launch", "--cpu", *(["--quiet"] if quiet else []), "--nnodes", "1:2",
        "--nproc_per_node", "1", "--max_restarts", "3", "--rdzv_backend", "c10d",
        "--rdzv_endpoint", f"127.0.0.1:{port}", *flags, str(script), str(tmp_path / "project"),
    ]  # fmt: skip
    return subprocess.Popen(
        command,
        cwd=tmp_path,
        env=node_env(tmp_path, **env),
        stdout=out,
        stderr=subprocess.STDOUT,
        start_new_session=own_session,
    )


START_ORDERS = ("host-first", "non-host-first")


def start_two_nodes(
    tmp_path: Path,
    script: Path,
    order: str = "host-first",
    own_session: bool = False,
    rdzv_conf: str = "",
    **env: str,
) -> tuple[subprocess.Popen, subprocess.Popen]:
    """Nodes a (hosts the rendezvous store) and b on one free port, in the start `order` (see
    START_ORDERS); returns (a, b). `own_session`: b's, for `kill_node`. `rdzv_conf`: more
    `--rdzv_conf` items for both."""
    from harness import free_port

    port = free_port()
    conf = lambda *items: ["--rdzv_conf", ",".join(filter(None, (*items, rdzv_conf)))]  # noqa: E731
    if order == "host-first":
        # Without is_host the first launcher on the port hosts the store: b starts once a listens.
        flags = conf() if rdzv_conf else []
        first = start_node(tmp_path, port, "a", script, *flags, **env)
        if not wait_until(lambda: port_open(port) or first.poll() is not None, limit=120):
            stop_all(first)
            raise AssertionError("node a's rendezvous store never listened")
        return first, start_node(
            tmp_path, port, "b", script, *flags, own_session=own_session, **env
        )
    assert order == "non-host-first", order
    second = start_node(
        tmp_path, port, "b", script, *conf("is_host=0"), own_session=own_session,
        quiet=False, **env,
    )  # fmt: skip
    # b's banner: its launcher has its plan and goes to the rendezvous (a launcher that wrongly
    # hosted the store would bind the port right after it).
    banner = lambda: "cadence launch:" in (tmp_path / "b.out").read_text()  # noqa: E731
    if not wait_until(lambda: banner() or second.poll() is not None, limit=120) or not banner():
        stop_all(second)
        raise AssertionError(
            "node b's launcher never started:\n" + (tmp_path / "b.out").read_text()
        )
    return start_node(tmp_path, port, "a", script, *conf("is_host=1"), **env), second


def _descendants(pid: int) -> list[int]:
    """Every process below `pid` (read from /proc), children before grandchildren."""
    children: dict[int, list[int]] = collections.defaultdict(list)
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # ended meanwhile
        children[int(fields[1])].append(int(stat.parent.name))
    found, queue = [], [pid]
    while queue and len(found) < 10_000:
        for child in children.get(queue.pop(0), []):
            found.append(child)
            queue.append(child)
    return found


def kill_node(launcher: subprocess.Popen) -> None:
    """A node's death: SIGKILL to its launcher's process group (started with `own_session`) and to
    the process group of every process below it (torch elastic starts each worker in its own)."""
    import signal

    groups = {os.getpgid(launcher.pid)}
    for pid in _descendants(launcher.pid):
        try:
            groups.add(os.getpgid(pid))
        except ProcessLookupError:
            pass
    groups.discard(os.getpgid(0))  # never this test's own group
    for group in groups:
        try:
            os.killpg(group, signal.SIGKILL)
        except ProcessLookupError:
            pass
    launcher.wait(timeout=30)


def steps(tmp_path: Path) -> list[dict]:
    """Every logged record of the job (its steps), in time order."""
    records = []
    for path in (tmp_path / "project").glob("log-*.jsonl"):
        for line in path.read_text().splitlines():
            if line.strip():
                records.append(json.loads(line))
    return sorted(records, key=lambda r: r["time"])


def sample_counts(records: list[dict], loader: str | None = None) -> collections.Counter:
    """How many times each (epoch, sample) was trained (from `loader`, for TRAIN_SCRIPT's records)."""
    counts: collections.Counter = collections.Counter()
    for record in records:
        if "samples" not in record:
            continue  # a resume's or a save's record
        samples = record["samples"] if loader is None else record["samples"][loader]
        counts.update((record["epoch"], sample) for sample in samples)
    return counts


def assert_trained(
    records: list[dict],
    epochs: int,
    samples: int,
    redone: list[dict] = (),
    loaders: tuple[str, ...] = LOADERS,
    where: str = "",
) -> None:
    """Every sample of every epoch of each of `loaders` trained: those of the steps in `redone`
    (trained again after a resume from an earlier checkpoint) twice, every other exactly once."""
    for loader in loaders:
        counts = sample_counts(records, loader)
        expected = {(epoch, sample) for epoch in range(epochs) for sample in range(samples)}
        assert set(counts) == expected, f"{where}{loader} loader: some samples were never trained"
        again = set(sample_counts(list(redone), loader))
        wrong = {key: n for key, n in counts.items() if n != (2 if key in again else 1)}
        assert not wrong, (
            f"{where}{loader} loader: (epoch, sample): times trained, where each was due "
            f"{'twice if redone, else ' if again else ''}once: {sorted(wrong.items())[:8]}"
        )


def wait_until(condition, limit: float) -> bool:
    """Poll `condition` every 0.1 s for at most `limit` seconds."""
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.1)
    return bool(condition())


def port_open(port: int) -> bool:
    """Whether something listens on 127.0.0.1:`port` (the first node's rendezvous store)."""
    import socket

    with socket.socket() as sock:
        sock.settimeout(0.5)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def stop_all(*processes: subprocess.Popen) -> None:
    """End what a test started (launchers whose workers die with them)."""
    for process in processes:
        if process.poll() is None:
            process.kill()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            pass


def children(pid: int) -> list[int]:
    """The pids of the processes whose parent is `pid` (a launcher's workers), read from /proc."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[-1].split()
        if len(fields) > 1 and fields[1] == str(pid):
            found.append(int(entry.name))
    return found


def launch_local(workdir: Path, processes: int, mode: str) -> list[dict]:
    """Run `workdir/train.py MODE WORKDIR` on `processes` local CPU processes through `cadence launch`
    (a clean environment); returns the JSON record each rank wrote as `MODE-PROCESSES-RANK.json`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CADENCE_", "PET_"))}
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(name, None)
    env.update(CUDA_VISIBLE_DEVICES="", OMP_NUM_THREADS="1")
    result = subprocess.run(
        [*CADENCE, "launch", "--cpu", "--num_processes", str(processes),
         str(workdir / "train.py"), mode, str(workdir)],
        cwd=workdir, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-4000:]
    return [
        json.loads((workdir / f"{mode}-{processes}-{r}.json").read_text()) for r in range(processes)
    ]
