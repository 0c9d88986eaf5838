"""Context parallelism: per-rank activation memory and step time at cp = 1, 2, 4 for one sequence of
L tokens (the same global tokens at every cp), CPU / gloo, FSDP2 over dp_shard_cp.

    python benchmarks/bench_context_parallel.py [--length 4096] [--steps 4] [--cp 1 2 4]

Activation memory: the bytes of the tensors autograd saves for backward during one forward (through
`torch.autograd.graph.saved_tensors_hooks`, those with this rank's sequence dimension, each storage
counted once, a DTensor by its local shard; weights left out): on
each rank, the largest over the timed steps; the table gives the largest over ranks. The growth of the
process's peak resident memory over the run (ru_maxrss) is shown too, noisier (allocator, gloo buffers).
Step time: the median over the timed steps (after one warm-up step) of forward + backward + SGD step
on the slowest rank. Per-rank activations must fall to about 1/cp.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time

import torch
import torch.nn.functional as F

WIDTH, HEADS, LAYERS, VOCAB = 128, 4, 2, 256


class Attention(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.qkv = torch.nn.Linear(WIDTH, 3 * WIDTH)
        self.proj = torch.nn.Linear(WIDTH, WIDTH)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, _ = x.shape
        q, k, v = self.qkv(x).view(b, n, 3, HEADS, WIDTH // HEADS).unbind(2)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(out.transpose(1, 2).reshape(b, n, WIDTH))


class Layer(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm = torch.nn.LayerNorm(WIDTH)
        self.self_attn = Attention()
        self.mlp = torch.nn.Sequential(
            torch.nn.Linear(WIDTH, 4 * WIDTH), torch.nn.GELU(), torch.nn.Linear(4 * WIDTH, WIDTH)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn(self.norm(x))
        return x + self.mlp(x)


class Model(torch.nn.Module):
    def __init__(self, length: int) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(VOCAB, WIDTH)
        self.positions = torch.nn.Embedding(length, WIDTH)
        self.layers = torch.nn.ModuleList(Layer() for _ in range(LAYERS))
        self.head = torch.nn.Linear(WIDTH, VOCAB)

    def forward(self, input_ids: torch.Tensor, position_ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(input_ids) + self.positions(position_ids)
        for layer in self.layers:
            x = layer(x)
        return self.head(x)


class SavedBytes:
    """Counts the bytes of the activations autograd saves for backward: the saved tensors that carry
    the sequence dimension (each storage once; a DTensor by its shard)."""

    def __init__(self, local_length: int) -> None:
        self.local_length = local_length
        self.storages: dict[int, int] = {}

    def pack(self, tensor: torch.Tensor) -> torch.Tensor:
        local = tensor.to_local() if hasattr(tensor, "to_local") else tensor
        # Activations carry this rank's sequence dimension; weights (FSDP2 saves its gathered copies,
        # which are not Parameter objects) do not: the lengths are chosen unlike any weight dimension.
        if isinstance(tensor, torch.nn.Parameter) or self.local_length not in local.shape:
            return tensor
        storage = local.untyped_storage()
        self.storages[storage.data_ptr()] = storage.nbytes()
        return tensor

    @property
    def total(self) -> int:
        return sum(self.storages.values())


def worker(length: int, steps: int, out: str) -> None:
    from cadence import Accelerator
    from cadence.plugins import FullyShardedDataParallelPlugin, ParallelismConfig

    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1:
        acc = Accelerator(
            parallelism_config=ParallelismConfig(cp_size=world),
            fsdp_plugin=FullyShardedDataParallelPlugin(fsdp_version=2),
        )
    else:
        acc = Accelerator(cpu=True)
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = Model(length)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    model, optimizer = acc.prepare(model, optimizer)
    rss_start = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    saved, times = [], []
    for step in range(steps + 1):
        generator = torch.Generator().manual_seed(step)
        tokens = torch.randint(0, VOCAB, (1, length + 1), generator=generator)
        inputs, labels = tokens[:, :-1].clone(), tokens[:, 1:].clone()
        positions = torch.arange(length).unsqueeze(0)
        counter = SavedBytes(length // world)
        acc.wait_for_everyone()
        start = time.perf_counter()
        with acc.maybe_context_parallel(
            buffers=[inputs, labels, positions], buffer_seq_dims=[1, 1, 1]
        ):
            with torch.autograd.graph.saved_tensors_hooks(counter.pack, lambda t: t):
                logits = model(inputs, positions)
                loss = F.cross_entropy(logits.reshape(-1, VOCAB), labels.reshape(-1))
            acc.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        elapsed = time.perf_counter() - start
        if step > 0:  # the first step warms up
            saved.append(counter.total)
            times.append(elapsed)
    rss_growth = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss_start
    record = {
        "rank": acc.process_index,
        "saved_bytes": max(saved),
        "step_s": statistics.median(times),
        "rss_growth_kib": rss_growth,
    }
    with open(f"{out}.{acc.process_index}", "w") as handle:
        json.dump(record, handle)
    acc.end_training()


def run(cp: int, length: int, steps: int) -> list[dict]:
    with tempfile.TemporaryDirectory() as folder:
        out = os.path.join(folder, "result")
        script = [os.path.abspath(__file__), "--worker", "--length", str(length)]
        script += ["--steps", str(steps), "--out", out]
        if cp == 1:
            command = [sys.executable, *script]
        else:
            command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(cp)]
            command += ["--standalone", *script]
        subprocess.run(command, check=True, timeout=1800)
        records = []
        for rank in range(cp):
            with open(f"{out}.{rank}") as handle:
                records.append(json.load(handle))
        return records


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    # Lengths (and length / cp) must differ from every weight dimension (128, 256, 384, 512).
    parser.add_argument("--length", type=int, default=4096)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--cp", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--worker", action="store_true")
    parser.add_argument("--out")
    args = parser.parse_args()
    if args.worker:
        worker(args.length, args.steps, args.out)
        return
    print(f"sequence length {args.length}, {args.steps} timed steps, load {os.getloadavg()[0]:.2f}")
    print("cp  activations/rank MiB  ratio  peak RSS growth/rank MiB  step s  step ratio")
    base = None
    for cp in args.cp:
        records = run(cp, args.length, args.steps)
        saved = max(r["saved_bytes"] for r in records) / 2**20
        rss = max(r["rss_growth_kib"] for r in records) / 1024
        step = max(r["step_s"] for r in records)
        base = base or (saved, step)
        print(
            f"{cp:<3d} {saved:20.1f}  {saved / base[0]:5.3f}  {rss:24.1f}  {step:6.3f}  "
            f"{step / base[1]:10.2f}"
        )


if __name__ == "__main__":
    main()
