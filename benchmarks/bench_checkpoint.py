"""Checkpoint benchmark: Cadence's atomic, verified checkpoints vs plain torch.save / torch.load.

State: a ~100M-parameter model with AdamW state (about 1.2 GB). Measured in one run, interleaved:
  save:  torch.save(model) + torch.save(optimizer)   vs  begin_checkpoint / write / commit
         (Cadence also fsyncs every file, checksums it and writes the manifest)
  load:  torch.load + load_state_dict                 vs  open_checkpoint + apply, with every
         checksum verified (and, for reference, with sizes only)
  async: in a short training loop, the time training is blocked by an asynchronous save (CPU copy
         made before returning, or made by the background thread with a fence before the next
         optimizer.step) vs the time of a synchronous save, and how much slower the loop got.

Run: .venv/bin/python benchmarks/bench_checkpoint.py [--rounds 3] [--params 100] [--threads N]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from collections import defaultdict
from functools import partial
from pathlib import Path

import torch

from cadence.checkpointing import (
    AsyncCheckpointSaver,
    apply_model_state,
    begin_checkpoint,
    open_checkpoint,
    write_and_commit,
)


def build_state(million_params: int):
    torch.manual_seed(0)
    width = 2048
    layers = max(1, round(million_params * 1e6 / (width * width + width)))
    model = torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(layers)])
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for p in model.parameters():
        p.grad = torch.randn_like(p) * 1e-3
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return model, optimizer


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


# ----------------------------------------------------------------------------- hand-written torch
def plain_save(model, optimizer, folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    torch.save(model.state_dict(), folder / "model.pt")
    torch.save(optimizer.state_dict(), folder / "optimizer.pt")


def plain_load(model, optimizer, folder: Path) -> None:
    model.load_state_dict(torch.load(folder / "model.pt", weights_only=True))
    optimizer.load_state_dict(torch.load(folder / "optimizer.pt", weights_only=True))


# ----------------------------------------------------------------------------- cadence
def cadence_save(model, optimizer, folder: Path) -> None:
    writer = begin_checkpoint(folder)
    writer.save_tensors("model.safetensors", model.state_dict())
    writer.save_object("optimizer.bin", optimizer.state_dict())
    writer.commit()


def cadence_load(model, optimizer, folder: Path, verify: str = "full") -> None:
    with open_checkpoint(folder, verify=verify) as ckpt:
        weights = ckpt.load_tensors("model.safetensors")
        optim = ckpt.load_object("optimizer.bin")
        ckpt.finish()  # with verify="full", every checksum is checked before anything is applied
    apply_model_state(model, weights)
    optimizer.load_state_dict(optim)


def train_with_save(model, optimizer, mode: str, folder: Path, saver: AsyncCheckpointSaver):
    """Three training steps with a save after the first; returns (blocked, total) seconds.

    blocked: time inside the save call, plus (deferred mode) the wait at the fence before the next
    optimizer.step(); total: wall time of the three steps (the background write competes for CPU).
    """
    batch = torch.randn(8, model[0].in_features)
    blocked = 0.0
    start = time.perf_counter()
    for step in range(3):
        model(batch).square().mean().backward()
        t = time.perf_counter()
        saver.fence()
        blocked += time.perf_counter() - t
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if step != 0 or mode == "none":
            continue
        t = time.perf_counter()
        if mode == "sync":
            cadence_save(model, optimizer, folder)
        else:
            saver.wait()
            live = {
                "model.safetensors": model.state_dict(),
                "optimizer.bin": optimizer.state_dict(),
            }
            writer = begin_checkpoint(folder)
            if mode == "async":
                saver.submit(write_and_commit, writer, saver.snapshot(live), commit=True)
            else:
                saver.submit_deferred(live, write_and_commit, writer, commit=True)
        blocked += time.perf_counter() - t
    total = time.perf_counter() - start
    saver.wait()  # end of training
    return blocked, total


# ----------------------------------------------------------------------------- report
LABELS = {
    "ps": "torch.save",
    "cs": "cadence save",
    "pl": "torch.load",
    "cl": "cadence load",
    "cls": "cadence load (sizes)",
    "sync_blocked": "sync: blocked",
    "async_blocked": "async: blocked",
    "deferred_blocked": "deferred: blocked",
    "none_total": "3 steps, no save",
    "sync_total": "3 steps, sync",
    "async_total": "3 steps, async",
    "deferred_total": "3 steps, deferred",
}


def report(name: str, ours: list[float], theirs: list[float], their_name: str) -> None:
    a, b = statistics.median(ours), statistics.median(theirs)
    print(f"{name:<34} cadence {a:7.3f}s   {their_name} {b:7.3f}s   ratio {a / b:5.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--params", type=int, default=100, help="model size in millions")
    parser.add_argument("--dir", default=None)
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    model, optimizer = build_state(args.params)
    n_params = sum(p.numel() for p in model.parameters())
    root = Path(args.dir or tempfile.mkdtemp(prefix="cadence-bench-ckpt-"))
    root.mkdir(parents=True, exist_ok=True)
    print(
        f"{n_params / 1e6:.1f}M parameters + AdamW state, {args.rounds} interleaved rounds, in "
        f"{root}, {torch.get_num_threads()} torch threads, load average {os.getloadavg()[0]:.1f}"
    )
    times: dict[str, list[float]] = defaultdict(list)
    saver = AsyncCheckpointSaver()
    try:
        for r in range(args.rounds):
            plain_dir, ours_dir = root / f"plain_{r}", root / f"cadence_{r}"
            saves = [
                ("ps", partial(plain_save, model, optimizer, plain_dir)),
                ("cs", partial(cadence_save, model, optimizer, ours_dir)),
            ]
            loads = [
                ("pl", partial(plain_load, model, optimizer, plain_dir)),
                ("cl", partial(cadence_load, model, optimizer, ours_dir)),
                ("cls", partial(cadence_load, model, optimizer, ours_dir, "sizes")),
            ]
            for pair in (saves, loads):
                for key, fn in pair if r % 2 == 0 else reversed(pair):  # alternate who goes first
                    times[key].append(timed(fn))
            shutil.rmtree(plain_dir)
            shutil.rmtree(ours_dir)
            modes = ["none", "sync", "async", "deferred"]
            for mode in modes if r % 2 == 0 else reversed(modes):
                folder = root / f"{mode}_{r}"
                blocked, total = train_with_save(model, optimizer, mode, folder, saver)
                times[f"{mode}_blocked"].append(blocked)
                times[f"{mode}_total"].append(total)
                shutil.rmtree(folder, ignore_errors=True)
    finally:
        saver.wait()
        if args.dir is None:
            shutil.rmtree(root, ignore_errors=True)
    for key, label in LABELS.items():
        print(f"  {label:<21}" + " ".join(f"{t:6.3f}" for t in times[key]))
    report("save (atomic+fsync+checksums)", times["cs"], times["ps"], "torch.save")
    report("load (checksums verified)", times["cl"], times["pl"], "torch.load")
    report("load (sizes verified)", times["cls"], times["pl"], "torch.load")
    sync = statistics.median(times["sync_blocked"])
    base = statistics.median(times["none_total"])
    for mode in ("async", "deferred"):
        blocked = statistics.median(times[f"{mode}_blocked"])
        slower = statistics.median(times[f"{mode}_total"]) - base
        print(
            f"{mode + ' save: training blocked':<34} {blocked:7.3f}s = {100 * blocked / sync:5.1f}% "
            f"of the {sync:.3f}s sync save; the 3 steps took {slower:+.3f}s vs no save"
        )


if __name__ == "__main__":
    main()
