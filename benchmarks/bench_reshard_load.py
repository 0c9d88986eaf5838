"""Resharding-load benchmark (issue 24, item 7): `load_state` of a checkpoint saved on 2 processes,
timed on 2 processes (same size) against 1 and 3 processes (resharding), the same checkpoint.

Cases, each saved once by `save_state` on 2 CPU processes (`cadence launch --cpu --num_processes 2`,
gloo, real processes) after 4 training steps, with a shuffled prepared DataLoader saved mid-epoch
(so the global data position is part of every load):
  ddp:   a replicated DDP model of --params million parameters (Linear layers of width 1024) and
         its AdamW state (12 bytes per parameter: 20M -> 240 MB): every rank reads the whole state;
  fsdp2: the same model sharded by FSDP2 (`fully_shard` per layer, SHARDED_STATE_DICT), saved
         through torch.distributed.checkpoint: on 1 or 3 processes each rank reads other shard
         boundaries than the ones written.
Each load launch (M processes) builds the model, reads the checkpoint's files once (warm page
cache), does one untimed load, then --loads timed `load_state` calls, each after a barrier; a
load's time is the maximum over the ranks (wall, and the process CPU time of all its threads).
Process start-up is never timed. After the last load the loader's remaining samples are checked:
across the ranks, every sample of the epoch not yet seen at the save, each once. Rounds interleave
the world sizes (order rotated each round); the ratio resharding / same size is taken within a
round, then median (min-max) over rounds. One thread per process (OMP_NUM_THREADS=1,
torch.set_num_threads(1)); M=3 on a 2-core machine oversubscribes the cores, so its wall time
includes waiting for a core: read the CPU time too.

Run: python benchmarks/bench_reshard_load.py [--params 20] [--rounds 3] [--loads 2]
     [--cases ddp,fsdp2] [--sizes 1,3] [--dir DIR] [--list-files]

Measured on the development machine (2-core VM shared with other jobs, load average 4.4 at the
start and 7.1 at the end), --params 20 --rounds 5 --loads 2; per load, max over ranks, median
(min-max) over the 5 rounds, ratios to the same-size load of the same round:
  ddp, 239 MB (every rank reads and verifies the whole replicated state):
    2 -> 2 (same size)  wall 0.28 s (0.19-0.39)   CPU 0.17 s (0.17-0.20)
    2 -> 1              wall 0.70x (0.55-0.79)     CPU 0.81x (0.62-0.84)
    2 -> 3              wall 1.82x (1.09-2.35)     CPU 1.03x (0.92-1.11)
  fsdp2, 240 MB (torch.distributed.checkpoint, 2 shard files per state):
    2 -> 2 (same size)  wall 0.17 s (0.14-0.28)   CPU 0.08 s (0.07-0.09)
    2 -> 1              wall 1.06x (0.64-2.39)     CPU 1.40x (1.17-1.64)
    2 -> 3              wall 1.76x (1.14-2.46)     CPU 1.35x (1.19-1.69)
A replicated state costs a rank about the same CPU on any number of processes (the data position
is 12 KB; 1 process alone is a little cheaper, probably as nobody shares its memory bandwidth); the
2 -> 3 wall time is mostly the third process waiting for one of the 2 cores. A sharded state read on
another number of processes costs more: torch.distributed.checkpoint loads every saved chunk that
overlaps a rank's new shard whole and copies the overlap out, so 1 process reads both files, and of
3 processes the middle one does too (the time is the slowest rank's). The .distcp files are checked
for size only on load (their checksums are in the manifest but not recomputed), so the fsdp2
numbers include no hashing; the ddp ones do.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

SAVED_ON = 2
WORKER = textwrap.dedent(
    """
    import json, os, pathlib, sys, time
    import torch
    torch.set_num_threads(1)
    import torch.distributed as dist
    from cadence import Accelerator
    from cadence.plugins import FullyShardedDataParallelPlugin

    case, mode, ckpt, params, loads, out = sys.argv[1:7]
    WIDTH, SAMPLES, BATCH, STEPS = 1024, 4096, 8, 4

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = torch.nn.Linear(WIDTH, WIDTH)
        def forward(self, x):
            return x + self.linear(x)

    plugin = None
    if case == "fsdp2":
        plugin = FullyShardedDataParallelPlugin(
            fsdp_version=2, auto_wrap_policy="transformer_based_wrap",
            transformer_cls_names_to_wrap=["Block"], state_dict_type="SHARDED_STATE_DICT")
    acc = Accelerator(cpu=True, fsdp_plugin=plugin)
    torch.manual_seed(0 if mode == "save" else 1)  # a load starts from other weights
    layers = max(1, round(float(params) * 1e6 / (WIDTH * WIDTH + WIDTH)))
    model = torch.nn.Sequential(*[Block() for _ in range(layers)])
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    torch.manual_seed(0)  # the same shuffled order on every rank and launch
    loader = torch.utils.data.DataLoader(range(SAMPLES), batch_size=BATCH, shuffle=True)
    model, optimizer, loader = acc.prepare(model, optimizer, loader)

    if mode == "save":
        for step, ids in enumerate(loader):
            x = torch.randn(len(ids), WIDTH, generator=torch.Generator().manual_seed(step))
            acc.backward(model(x).pow(2).mean())
            optimizer.step()
            optimizer.zero_grad()
            if step + 1 == STEPS:
                acc.save_state(ckpt)  # mid-epoch: the loader's position is in the checkpoint
                break
        acc.wait_for_everyone()
        raise SystemExit(0)

    for path in sorted(p for p in pathlib.Path(ckpt).rglob("*") if p.is_file()):
        with open(path, "rb") as f:  # a warm page cache: the disk is not what is measured
            while f.read(64 << 20):
                pass
    times = []
    for i in range(int(loads) + 1):  # the first load is untimed (allocator, lazy imports)
        acc.wait_for_everyone()
        wall, cpu = time.perf_counter(), time.process_time()
        acc.load_state(ckpt)
        both = torch.tensor([time.perf_counter() - wall, time.process_time() - cpu],
                            dtype=torch.float64)
        if dist.is_initialized():  # a 1-process launch has no group
            dist.all_reduce(both, op=dist.ReduceOp.MAX)
        if i:
            times.append(both.tolist())
    seen = [int(i) for ids in loader for i in ids]  # the rest of the epoch, on this rank
    gathered = [seen]
    if dist.is_initialized():
        gathered = [None] * acc.num_processes
        dist.all_gather_object(gathered, seen)
    if acc.is_main_process:
        rest = [i for rank in gathered for i in rank]
        with open(out, "w") as f:
            json.dump({"times": times, "rest": len(set(rest)), "rest_total": len(rest),
                       "expected": SAMPLES - SAVED * STEPS * BATCH}, f)
    """
).replace("SAVED *", f"{SAVED_ON} *")


def launch(script: Path, processes: int, *args: str) -> None:
    """`cadence launch --cpu` of the worker on `processes` processes; raises with its output."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CADENCE_", "PET_"))}
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(name, None)
    env.update(CUDA_VISIBLE_DEVICES="", OMP_NUM_THREADS="1")
    command = [sys.executable, "-m", "cadence.commands.cli", "launch", "--cpu",
               "--num_processes", str(processes), str(script), *args]  # fmt: skip
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=900)
    if result.returncode:
        raise RuntimeError(f"{' '.join(command)} failed:\n{result.stdout}\n{result.stderr}")


def load_times(script: Path, case: str, processes: int, ckpt: Path, options) -> dict:
    """One load launch on `processes` processes: the median of its timed loads (wall, CPU)."""
    out = ckpt.parent / f"{case}-{processes}.json"
    launch(script, processes, case, "load", str(ckpt), str(options.params), str(options.loads),
           str(out))  # fmt: skip
    report = json.loads(out.read_text())
    if not report["rest"] == report["expected"] <= report["rest_total"]:
        raise RuntimeError(f"{case} on {processes}: the resumed epoch is wrong: {report}")
    walls, cpus = zip(*report["times"])
    return {"wall": statistics.median(walls), "cpu": statistics.median(cpus)}


def spread(values: list[float], unit: str = "") -> str:
    return f"{statistics.median(values):.2f}{unit} ({min(values):.2f}-{max(values):.2f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--params", type=float, default=20, help="millions of parameters")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--loads", type=int, default=2, help="timed loads per launch")
    parser.add_argument("--cases", default="ddp,fsdp2")
    parser.add_argument("--sizes", default="1,3", help="resharding world sizes (same size: 2)")
    parser.add_argument(
        "--dir", default=None, help="where the checkpoints go (default: a temp dir)"
    )
    parser.add_argument("--list-files", action="store_true", help="print each checkpoint's files")
    options = parser.parse_args()
    others = [int(s) for s in options.sizes.split(",")]
    if options.params <= 0 or options.rounds < 1 or options.loads < 1 or not others:
        parser.error("--params must be > 0, --rounds and --loads >= 1, --sizes not empty")
    print("load average (1, 5, 15 min): {:.1f} {:.1f} {:.1f}".format(*os.getloadavg()), flush=True)
    workdir = Path(tempfile.mkdtemp(prefix="bench-reshard-", dir=options.dir))
    try:
        script = workdir / "worker.py"
        script.write_text(WORKER)
        for case in options.cases.split(","):
            ckpt = workdir / case / "ckpt"
            ckpt.parent.mkdir()
            start = time.perf_counter()
            launch(script, SAVED_ON, case, "save", str(ckpt), str(options.params), "0", "-")
            files = [p for p in ckpt.rglob("*") if p.is_file()]
            print(f"{case}: saved on {SAVED_ON} processes, {len(files)} files, "
                  f"{sum(p.stat().st_size for p in files) / 1e6:.0f} MB "
                  f"(launch {time.perf_counter() - start:.0f} s)", flush=True)  # fmt: skip
            if options.list_files:
                print("\n".join(f"    {p.relative_to(ckpt)}" for p in sorted(files)))
            sizes = [SAVED_ON, *others]
            results: dict[int, list[dict]] = {m: [] for m in sizes}
            for round_index in range(options.rounds):
                shift = round_index % len(sizes)
                for m in sizes[shift:] + sizes[:shift]:
                    results[m].append(load_times(script, case, m, ckpt, options))
            same = results[SAVED_ON]
            print(f"  same size (2 -> 2): wall {spread([r['wall'] for r in same], ' s')}"
                  f"   CPU {spread([r['cpu'] for r in same], ' s')}")  # fmt: skip
            for m in others:
                walls = [r["wall"] / s["wall"] for r, s in zip(results[m], same)]
                cpus = [r["cpu"] / s["cpu"] for r, s in zip(results[m], same)]
                print(f"  2 -> {m}: wall {spread([r['wall'] for r in results[m]], ' s')}"
                      f"   ratio to same size: wall {spread(walls, 'x')}"
                      f"   CPU {spread(cpus, 'x')}", flush=True)  # fmt: skip
            shutil.rmtree(ckpt.parent, ignore_errors=True)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    print("load average (1, 5, 15 min): {:.1f} {:.1f} {:.1f}".format(*os.getloadavg()), flush=True)


if __name__ == "__main__":
    main()
