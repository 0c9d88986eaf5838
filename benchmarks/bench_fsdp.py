"""FSDP2 through Cadence against hand-written `fully_shard` and hand-written DDP, on a ~20M-parameter
model and 2 gloo processes.

    python benchmarks/bench_fsdp.py [--rounds 5] [--steps 6]

Step time: the three variants live in the same 2 processes and run interleaved, round after round, so
machine load hits them alike; the Cadence / fully_shard ratio is the median of the ratios of rounds run
back to back. Memory per process: the
bytes of parameters, and of parameters + gradients + optimizer state, that each process holds; and
the growth of peak resident memory while training, each variant in fresh processes.

Targets: Cadence FSDP2 step time within 1.03x of hand-written fully_shard; parameter memory about half
of DDP's.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import socket
import statistics
import subprocess
import sys
import time

import torch
import torch.distributed as dist

WIDTH, BLOCKS, BATCH = 768, 4, 8


class Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up = torch.nn.Linear(WIDTH, 4 * WIDTH)
        self.down = torch.nn.Linear(4 * WIDTH, WIDTH)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(torch.relu(self.up(x)))


class Model(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = torch.nn.ModuleList(Block() for _ in range(BLOCKS))
        self.head = torch.nn.Linear(WIDTH, WIDTH)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def make_model() -> Model:
    torch.manual_seed(0)
    return Model()


def local_bytes(tensors) -> int:
    total = 0
    for t in tensors:
        if t is None:
            continue
        t = t.to_local() if hasattr(t, "to_local") else t
        total += t.numel() * t.element_size()
    return total


def optimizer_bytes(optimizer: torch.optim.Optimizer) -> int:
    inner = getattr(optimizer, "optimizer", optimizer)
    return local_bytes(
        v for state in inner.state.values() for v in state.values() if torch.is_tensor(v)
    )


# -- the three variants: each returns (model, optimizer, step function) ---------------------------------
def hand_written_fully_shard():
    from torch.distributed.fsdp import fully_shard

    model = make_model()
    for block in model.blocks:
        fully_shard(block)
    fully_shard(model, reshard_after_forward=False)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def step(x, y):
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()

    return model, optimizer, step


def hand_written_ddp():
    from torch.nn.parallel import DistributedDataParallel

    model = DistributedDataParallel(make_model())
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def step(x, y):
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()

    return model, optimizer, step


def cadence_fsdp2():
    from cadence import Accelerator
    from cadence.plugins import FullyShardedDataParallelPlugin

    plugin = FullyShardedDataParallelPlugin(
        fsdp_version=2,
        auto_wrap_policy="transformer_based_wrap",
        transformer_cls_names_to_wrap=["Block"],
    )
    accelerator = Accelerator(fsdp_plugin=plugin)
    model = make_model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    model, optimizer = accelerator.prepare(model, optimizer)

    def step(x, y):
        loss = torch.nn.functional.mse_loss(model(x), y)
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()

    return model, optimizer, step


VARIANTS = {
    "cadence_fsdp2": cadence_fsdp2,
    "fully_shard": hand_written_fully_shard,
    "ddp": hand_written_ddp,
}


def batches(count: int):
    generator = torch.Generator().manual_seed(dist.get_rank())
    return [
        (
            torch.randn(BATCH, WIDTH, generator=generator),
            torch.randn(BATCH, WIDTH, generator=generator),
        )
        for _ in range(count)
    ]


def timed_steps(step, data) -> float:
    dist.barrier()
    start = time.perf_counter()
    for x, y in data:
        step(x, y)
    dist.barrier()
    return (time.perf_counter() - start) / len(data)


# -- worker modes (run under torch.distributed.run) ------------------------------------------------------
def worker_timing(rounds: int, steps: int) -> None:
    # A second, identical hand-written model measures the noise floor of the comparison.
    makers = dict(VARIANTS, fully_shard_again=hand_written_fully_shard)
    built = {name: make() for name, make in makers.items()}
    data = batches(steps)
    for _, _, step in built.values():  # warm up: first all-gathers, optimizer state
        timed_steps(step, data[:2])
    times = {name: [] for name in built}
    for round_index in range(rounds):
        order = list(built) if round_index % 2 == 0 else list(reversed(built))
        for name in order:
            times[name].append(timed_steps(built[name][2], data))
    if dist.get_rank() == 0:
        result = {name: statistics.median(t) for name, t in times.items()}

        # Rounds of different variants run back to back: their ratio cancels slow drifts in machine load.
        def paired(a: str, b: str) -> float:
            return statistics.median(x / y for x, y in zip(times[a], times[b]))

        result["paired_ratio"] = paired("cadence_fsdp2", "fully_shard")
        result["control_ratio"] = paired("fully_shard_again", "fully_shard")
        print(json.dumps(result))


def worker_memory(variant: str, steps: int) -> None:
    baseline = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    model, optimizer, step = VARIANTS[variant]()
    data = batches(steps)
    for x, y in data:
        step(x, y)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    params = list(model.parameters())
    report = {
        "params": local_bytes(params),
        "state": local_bytes(params) + optimizer_bytes(optimizer),
        "rss_growth": (peak - baseline) * 1024,
        "total_params": sum(p.numel() for p in make_model().parameters()),
    }
    reports = [None] * dist.get_world_size()
    dist.all_gather_object(reports, report)
    if dist.get_rank() == 0:
        print(json.dumps({k: max(r[k] for r in reports) for k in report}))


# -- driver --------------------------------------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(*args: str) -> dict:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
               "--master_port", str(free_port()), __file__, "--worker", *args]  # fmt: skip
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"benchmark worker failed:\n{done.stderr[-4000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--worker", nargs="*")
    args = parser.parse_args()
    if args.worker is not None:
        torch.set_num_threads(1)
        dist.init_process_group("gloo")
        try:
            if args.worker[0] == "timing":
                worker_timing(args.rounds, args.steps)
            else:
                worker_memory(args.worker[1], args.steps)
        finally:
            dist.destroy_process_group()
        return

    times = launch("timing", "--rounds", str(args.rounds), "--steps", str(args.steps))
    memory = {name: launch("memory", name, "--steps", str(args.steps)) for name in VARIANTS}
    mb = 1 / 2**20
    print(
        f"model: {memory['ddp']['total_params'] / 1e6:.1f}M parameters, 2 processes, gloo, batch {BATCH}/rank"
    )
    print(
        f"{'variant':<15}{'step ms':>10}{'params MB':>12}{'+grads/optim MB':>17}{'peak RSS +MB':>14}"
    )
    for name in VARIANTS:
        m = memory[name]
        print(
            f"{name:<15}{times[name] * 1e3:>10.1f}{m['params'] * mb:>12.1f}{m['state'] * mb:>17.1f}"
            f"{m['rss_growth'] * mb:>14.1f}"
        )
    step_ratio = times["paired_ratio"]
    param_ratio = memory["cadence_fsdp2"]["params"] / memory["ddp"]["params"]
    state_ratio = memory["cadence_fsdp2"]["state"] / memory["ddp"]["state"]
    rss_ratio = memory["cadence_fsdp2"]["rss_growth"] / max(memory["ddp"]["rss_growth"], 1)
    print(
        f"step time, Cadence FSDP2 / hand-written fully_shard: {step_ratio:.3f}x (target <= 1.03x; "
        "median of back-to-back round ratios)"
    )
    print(
        f"noise floor, hand-written fully_shard / itself:    {times['control_ratio']:.3f}x (same code twice)"
    )
    print(
        f"step time, Cadence FSDP2 / hand-written DDP:         {times['cadence_fsdp2'] / times['ddp']:.3f}x"
    )
    print(f"parameter memory per process, FSDP2 / DDP:           {param_ratio:.3f}x (target ~0.5x)")
    print(f"params + optimizer state per process, FSDP2 / DDP:   {state_ratio:.3f}x")
    print(f"peak RSS growth per process, FSDP2 / DDP:            {rss_ratio:.3f}x")


if __name__ == "__main__":
    main()
