"""Pipeline parallelism: parameters and activation memory per rank against pp_size, step time of each
schedule against one process and against FSDP2 on the same processes, and the measured bubble
against the schedule's theoretical one. CPU / gloo, one thread per process.

    python benchmarks/bench_pipeline.py [--pp 2 4] [--layers 8] [--width 256] [--batch 32]
        [--microbatches 4] [--steps 4] [--schedules GPipe 1F1B Interleaved1F1B ZBVZeroBubble]

Model: an input layer, `layers` residual MLP blocks of `width`, an output layer; the same global
batch for every run (pp ranks all read it; FSDP2 splits it over its ranks).
Parameters per rank: this rank's elements (a DTensor by its local shard). Activation memory: the
peak over one step of the bytes autograd holds for backward (saved tensors, weights left out, each
storage counted once while it is alive), on the rank with the most. Step time: the median of the
timed steps (after one warm-up) on the slowest rank. Measured bubble: 1 - T1 / (pp x Tpp), the share
of the pipeline's process time that does not do one process's work (idle waits and the
send/receive cost together). Theoretical bubble of a pipeline of p processes, v stages each, m
micro-batches: (p - 1) / (v m + p - 1) for GPipe, 1F1B and Interleaved1F1B; the zero-bubble
schedules aim at about 0. On fewer cores than processes the times measure the machine, not the
schedule: the script prints the load and the core count.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import weakref

import torch

FEATURES, OUTPUTS = 64, 8


class Block(torch.nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.up = torch.nn.Linear(width, 4 * width)
        self.down = torch.nn.Linear(4 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(torch.nn.functional.gelu(self.up(x)))


def make_model(layers: int, width: int) -> torch.nn.Sequential:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(FEATURES, width),
        *[Block(width) for _ in range(layers)],
        torch.nn.Linear(width, OUTPUTS),
    )


def mse(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.mse_loss(output, target)


class LiveSaved:
    """The peak of the bytes autograd holds for backward: each saved tensor's storage counted from
    its packing until the tensor is freed; parameters and their views left out."""

    def __init__(self, weights: set[int]) -> None:
        self.weights = weights
        self.live: dict[int, int] = {}
        self.peak = 0

    def pack(self, tensor: torch.Tensor) -> torch.Tensor:
        local = tensor.to_local() if hasattr(tensor, "to_local") else tensor
        storage = local.untyped_storage()
        key = storage.data_ptr()
        if isinstance(tensor, torch.nn.Parameter) or key in self.weights or key in self.live:
            return tensor
        self.live[key] = storage.nbytes()
        self.peak = max(self.peak, sum(self.live.values()))
        weakref.finalize(local, self.live.pop, key, None)
        return tensor


def worker(args: argparse.Namespace) -> None:
    from cadence import Accelerator
    from cadence.plugins import (
        FullyShardedDataParallelPlugin,
        ParallelismConfig,
        PipelineParallelConfig,
    )

    torch.set_num_threads(1)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    pipeline = args.mode not in ("single", "fsdp2")
    if args.mode == "single":
        acc = Accelerator(cpu=True)
    elif args.mode == "fsdp2":
        acc = Accelerator(
            parallelism_config=ParallelismConfig(dp_shard_size=world),
            fsdp_plugin=FullyShardedDataParallelPlugin(fsdp_version=2),
        )
    else:
        handler = PipelineParallelConfig(
            schedule=args.mode, n_microbatches=args.microbatches, loss_fn=mse
        )
        acc = Accelerator(parallelism_config=ParallelismConfig(pp_size=world, pp_handler=handler))
    model = make_model(args.layers, args.width)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    model, optimizer = acc.prepare(model, optimizer)
    params = [p.to_local() if hasattr(p, "to_local") else p for p in model.parameters()]
    weights = {p.untyped_storage().data_ptr() for p in params}
    share = args.batch // world if args.mode == "fsdp2" else args.batch
    peaks, times = [], []
    for step in range(args.steps + 1):
        generator = torch.Generator().manual_seed(step)
        x = torch.randn(args.batch, FEATURES, generator=generator)
        y = torch.randn(args.batch, OUTPUTS, generator=generator)
        begin = acc.process_index * share if args.mode == "fsdp2" else 0
        x, y = x[begin : begin + share], y[begin : begin + share]
        counter = LiveSaved(weights)
        acc.wait_for_everyone()
        start = time.perf_counter()
        with torch.autograd.graph.saved_tensors_hooks(counter.pack, lambda t: t):
            loss = model(x, labels=y) if pipeline else mse(model(x), y)
            acc.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        elapsed = time.perf_counter() - start
        if step > 0:
            peaks.append(counter.peak)
            times.append(elapsed)
    record = {
        "params": sum(p.numel() for p in params),
        "activations": max(peaks),
        "step_s": statistics.median(times),
    }
    with open(f"{args.out}.{acc.process_index}", "w") as handle:
        json.dump(record, handle)
    acc.end_training()


def run(mode: str, processes: int, args: argparse.Namespace) -> list[dict]:
    with tempfile.TemporaryDirectory() as folder:
        out = os.path.join(folder, "result")
        script = [os.path.abspath(__file__), "--worker", "--mode", mode, "--out", out]
        for name in ("layers", "width", "batch", "microbatches", "steps"):
            script += [f"--{name}", str(getattr(args, name))]
        if processes == 1:
            command = [sys.executable, *script]
        else:
            command = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
            command += ["--nproc_per_node", str(processes), *script]
        done = subprocess.run(command, timeout=1800, capture_output=True, text=True)
        if done.returncode:
            raise SystemExit(f"{mode} on {processes} processes failed:\n{done.stderr[-4000:]}")
        records = []
        for rank in range(processes):
            with open(f"{out}.{rank}") as handle:
                records.append(json.load(handle))
        return records


def theoretical_bubble(schedule: str, p: int, m: int) -> str:
    if schedule in ("ZBVZeroBubble", "InterleavedZeroBubble"):
        return "~0"
    v = 2 if schedule == "Interleaved1F1B" else 1
    return f"{(p - 1) / (v * m + p - 1):.3f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pp", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--microbatches", type=int, default=4)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument(
        "--schedules", nargs="+", default=["GPipe", "1F1B", "Interleaved1F1B", "ZBVZeroBubble"]
    )
    parser.add_argument("--worker", action="store_true")
    parser.add_argument("--mode")
    parser.add_argument("--out")
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return
    print(
        f"{args.layers} blocks of width {args.width}, batch {args.batch}, {args.microbatches} "
        f"micro-batches, {args.steps} timed steps; {os.cpu_count()} cores, load "
        f"{os.getloadavg()[0]:.2f}"
    )
    single = run("single", 1, args)[0]
    header = "run                      procs  params/rank  ratio  activations/rank MiB  step s"
    print(header + "  bubble measured  theoretical")
    print(
        f"{'one process':<24} {1:5d}  {single['params']:11d}  1.000  "
        f"{single['activations'] / 2**20:20.2f}  {single['step_s']:6.3f}"
    )
    for p in args.pp:
        fsdp = run("fsdp2", p, args)
        print(
            f"{'FSDP2 dp_shard':<24} {p:5d}  {max(r['params'] for r in fsdp):11d}  "
            f"{max(r['params'] for r in fsdp) / single['params']:5.3f}  "
            f"{max(r['activations'] for r in fsdp) / 2**20:20.2f}  "
            f"{max(r['step_s'] for r in fsdp):6.3f}"
        )
        for schedule in args.schedules:
            records = run(schedule, p, args)
            step = max(r["step_s"] for r in records)
            params = max(r["params"] for r in records)
            measured = 1 - single["step_s"] / (p * step)
            print(
                f"{'pp ' + schedule:<24} {p:5d}  {params:11d}  {params / single['params']:5.3f}  "
                f"{max(r['activations'] for r in records) / 2**20:20.2f}  {step:6.3f}  "
                f"{measured:15.3f}  {theoretical_bubble(schedule, p, args.microbatches):>11}"
            )


if __name__ == "__main__":
    main()
