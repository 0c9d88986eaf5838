"""Checkpoint benchmark (issue 14): Accelerator.save_state / load_state against bare torch, the
reference library and the disk itself, interleaved in one run, with 1 and 2 processes.

State: a model of --params million parameters (Linear layers of width 2048) with AdamW state
(about 12 bytes per parameter in all: 100M -> 1.2 GB). Per round, in alternating order:
  save:  bare torch.save(model.state_dict()) + torch.save(optimizer.state_dict()) (no fsync)
         vs Cadence save_state (atomic: fsync per file and per folder, checksums, manifest)
         vs the reference's save_state, run in a subprocess of /work/ref-venv/bin/python
  disk:  a dd-style write + fsync of the same byte count from memory (the disk's own speed)
  load:  bare torch.load(weights_only=True) + load_state_dict
         vs Cadence load_state (every checksum verified before anything is deserialized)
         vs the reference's load_state (subprocess)
  async: the time save_state(async_save=True) blocks the caller (the snapshot), vs a sync save
With 2 processes the model is replicated (DDP); rank 0 writes the model and optimizer, every
rank its RNG state, as save_state does; times are rank 0's between barriers. Loads read from the
page cache for every contender alike (the cache is not dropped: other users share this machine);
before each timed operation, os.sync() flushes dirty data so no contender pays for another's writes.

Run: python benchmarks/bench_checkpoint.py [--params 100] [--rounds 3] [--procs 1 2]
     [--dir /path/on/the/disk] [--reference /work/ref-venv/bin/python | --reference none]
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
from collections import defaultdict
from functools import partial
from pathlib import Path

import torch

WIDTH = 2048


def build_state(million_params: int):
    torch.manual_seed(0)
    layers = max(1, round(million_params * 1e6 / (WIDTH * WIDTH + WIDTH)))
    model = torch.nn.Sequential(*[torch.nn.Linear(WIDTH, WIDTH) for _ in range(layers)])
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for p in model.parameters():
        p.grad = torch.randn_like(p) * 1e-3
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return model, optimizer


def folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def dd_write(path: Path, nbytes: int, buffer: memoryview) -> None:
    """Write `nbytes` from memory in large chunks, then fsync: the disk's sequential write speed."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        left = nbytes
        while left:
            left -= os.write(fd, buffer[: min(left, len(buffer))])
        os.fsync(fd)
    finally:
        os.close(fd)
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


# ----------------------------------------------------------------------------- the reference
REFERENCE_SCRIPT = textwrap.dedent(
    """
    import json, os, shutil, sys, time
    import torch
    import torch.distributed as dist
    import torch.multiprocessing as mp

    def build(million):
        torch.manual_seed(0)
        width = %(width)d
        layers = max(1, round(million * 1e6 / (width * width + width)))
        model = torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(layers)])
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        for p in model.parameters():
            p.grad = torch.randn_like(p) * 1e-3
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return model, optimizer

    def run(rank, world, million, folder, port, out):
        os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world),
                          LOCAL_WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
        from accelerate import Accelerator
        acc = Accelerator(cpu=True)
        model, optimizer = acc.prepare(*build(million))
        acc.wait_for_everyone()
        t = time.perf_counter()
        acc.save_state(folder)
        acc.wait_for_everyone()
        save = time.perf_counter() - t
        t = time.perf_counter()
        acc.load_state(folder)
        acc.wait_for_everyone()
        load = time.perf_counter() - t
        if rank == 0:
            size = sum(os.path.getsize(os.path.join(d, n)) for d, _, ns in os.walk(folder) for n in ns)
            with open(out, "w") as f:
                json.dump({"save": save, "load": load, "bytes": size}, f)

    if __name__ == "__main__":
        world, million, folder, port, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5]
        if world == 1:
            run(0, 1, million, folder, port, out)
        else:
            mp.spawn(run, args=(world, million, folder, port, out), nprocs=world)
    """
)


def run_reference(python: str, world: int, million: int, folder: Path, port: int) -> dict | None:
    script = folder.parent / "reference_bench.py"
    script.write_text(REFERENCE_SCRIPT % {"width": WIDTH})
    out = folder.parent / "reference_times.json"
    os.sync()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH",)}
    env["OMP_NUM_THREADS"] = str(torch.get_num_threads())
    done = subprocess.run(
        [python, str(script), str(world), str(million), str(folder), str(port), str(out)],
        capture_output=True,
        text=True,
        env=env,
    )
    shutil.rmtree(folder, ignore_errors=True)
    if done.returncode != 0 or not out.exists():
        print("reference run failed:", done.stderr[-2000:], file=sys.stderr)
        return None
    return json.loads(out.read_text())


# ----------------------------------------------------------------------------- one process's work
def worker(rank: int, world: int, args: argparse.Namespace, root: str, port: int) -> None:
    import torch.distributed as dist

    if world > 1:
        os.environ.update(
            RANK=str(rank),
            LOCAL_RANK=str(rank),
            WORLD_SIZE=str(world),
            LOCAL_WORLD_SIZE=str(world),
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
        )
    from cadence import Accelerator

    acc = Accelerator(cpu=True)
    model, optimizer = build_state(args.params)
    model, optimizer = acc.prepare(model, optimizer)
    inner = acc.unwrap_model(model)
    main = acc.is_main_process
    root = Path(root)
    times: dict[str, list[float]] = defaultdict(list)
    nbytes = 0
    chunk = memoryview(bytearray(64 << 20))

    def timed(key: str, fn) -> None:
        # Every contender starts with no dirty data waiting for the disk (earlier writes would
        # otherwise throttle whoever comes next).
        os.sync()
        acc.wait_for_everyone()
        start = time.perf_counter()
        fn()
        acc.wait_for_everyone()
        times[key].append(time.perf_counter() - start)

    def bare_save(folder: Path) -> None:
        if main:
            folder.mkdir(parents=True, exist_ok=True)
            torch.save(inner.state_dict(), folder / "model.pt")
            torch.save(optimizer.optimizer.state_dict(), folder / "optimizer.pt")

    def bare_load(folder: Path) -> None:
        inner.load_state_dict(torch.load(folder / "model.pt", weights_only=True))
        optimizer.optimizer.load_state_dict(torch.load(folder / "optimizer.pt", weights_only=True))

    def disk_write(path: Path, nbytes: int) -> None:
        if main:
            dd_write(path, nbytes, chunk)

    for r in range(args.rounds):
        bare, ours, disk = root / f"bare_{r}", root / f"cadence_{r}", root / f"dd_{r}.bin"
        saves = [
            ("bare_save", partial(bare_save, bare)),
            ("cadence_save", partial(acc.save_state, ours)),
        ]
        for key, fn in saves if r % 2 == 0 else reversed(saves):
            timed(key, fn)
        if main and not nbytes:
            nbytes = folder_bytes(ours)
        timed("dd", partial(disk_write, disk, nbytes))
        loads = [
            ("bare_load", partial(bare_load, bare)),
            ("cadence_load", partial(acc.load_state, ours)),
        ]
        for key, fn in loads if r % 2 == 0 else reversed(loads):
            timed(key, fn)
        acc.wait_for_everyone()
        if main:
            shutil.rmtree(bare, ignore_errors=True)
            shutil.rmtree(ours, ignore_errors=True)
            disk.unlink(missing_ok=True)
        # Async: the caller is blocked only for the snapshot; the write finishes in the background.
        folder = root / f"async_{r}"
        timed("async_blocked", partial(acc.save_state, folder, async_save=True))
        start = time.perf_counter()
        acc._checkpointer.wait_for_async_save()
        times["async_rest"].append(time.perf_counter() - start)
        acc.wait_for_everyone()
        if main:
            shutil.rmtree(folder, ignore_errors=True)
            if args.reference != "none":
                result = run_reference(
                    args.reference, world, args.params, root / f"ref_{r}", port + 1 + r
                )
                if result is not None:
                    times["reference_save"].append(result["save"])
                    times["reference_load"].append(result["load"])
                    if r == 0:
                        print(f"reference checkpoint: {result['bytes'] / 1e6:.0f} MB", flush=True)
        acc.wait_for_everyone()
    if main:
        (root / f"times_{world}.json").write_text(json.dumps({"times": times, "bytes": nbytes}))
    if world > 1:
        dist.destroy_process_group()


def report(world: int, data: dict, n_params: int) -> None:
    times, nbytes = data["times"], data["bytes"]
    med = {k: statistics.median(v) for k, v in times.items() if v}
    mb = nbytes / 1e6
    print(
        f"\n== {world} process(es): {n_params / 1e6:.1f}M parameters + AdamW, {mb:.0f} MB on disk"
    )
    for key, values in times.items():
        print(f"  {key:<16}" + " ".join(f"{t:7.3f}" for t in values) + f"   median {med[key]:.3f}s")

    def ratio(a: str, b: str, label: str) -> None:
        if a in med and b in med:
            print(f"  {label:<48} {med[a]:7.3f}s / {med[b]:7.3f}s = {med[a] / med[b]:5.2f}x")

    ratio("cadence_save", "bare_save", "save_state vs bare torch.save (target <= 1.0x)")
    ratio("cadence_save", "reference_save", "save_state vs the reference (target <= 0.8x)")
    ratio("cadence_load", "bare_load", "load_state vs torch.load+load_state_dict (<= 1.0x)")
    ratio("cadence_load", "reference_load", "load_state vs the reference")
    ratio("async_blocked", "cadence_save", "async save blocks vs a sync save (<= 10%)")
    if "dd" in med:
        disk = mb / med["dd"]
        ours = mb / med["cadence_save"]
        print(
            f"  {'MB/s: save_state vs dd write+fsync (>= 80%)':<48} {ours:7.0f} / {disk:7.0f} MB/s"
            f" = {100 * ours / disk:5.1f}%"
        )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--params", type=int, default=100, help="model size in millions")
    parser.add_argument("--procs", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--dir", default=None)
    parser.add_argument("--reference", default="/work/ref-venv/bin/python")
    args = parser.parse_args()
    if args.reference != "none" and not os.path.exists(args.reference):
        print(f"no reference interpreter at {args.reference}; skipping it")
        args.reference = "none"
    base = Path(args.dir or tempfile.mkdtemp(prefix="cadence-bench-ckpt-"))
    n_params = sum(p.numel() for p in build_state(args.params)[0].parameters())
    print(
        f"{n_params / 1e6:.1f}M parameters, {args.rounds} interleaved rounds in {base}, "
        f"{torch.get_num_threads()} torch threads, load average {os.getloadavg()[0]:.1f}"
    )
    try:
        for world in args.procs:
            root = base / f"procs_{world}"
            root.mkdir(parents=True, exist_ok=True)
            port = 29700 + 10 * world + os.getpid() % 200
            if world == 1:
                worker(0, 1, args, str(root), port)
            else:
                torch.multiprocessing.spawn(
                    worker, args=(world, args, str(root), port), nprocs=world
                )
            report(world, json.loads((root / f"times_{world}.json").read_text()), n_params)
    finally:
        if args.dir is None:
            shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
