"""What Cadence's always-on diagnostics cost per training step: the ledger (and its watchdog thread),
then the gloo pre-collective handshake, against the same Cadence loop with them off and against the
loop written by hand with DDP. 2 gloo processes, tiny model, configurations interleaved round by
round in the same processes (so machine noise hits all alike); medians of the per-round ratios.

Two loops: a plain step (forward, backward, optimizer step: the ledger sees the DDP backward) and the
same step plus `reduce(loss, "mean")` for logging (one more Cadence collective per step).

    python benchmarks/bench_ledger.py [--rounds 9] [--steps 300]
"""

import argparse
import os
import socket
import statistics
import time
from contextlib import nullcontext

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel

CONFIGS = (
    "hand-written",
    "cadence, diagnostics off",
    "cadence, ledger",
    "cadence, ledger+handshake",
)


def batches(steps):
    generator = torch.Generator().manual_seed(0)
    return [
        (torch.randn(16, 8, generator=generator), torch.randn(16, 1, generator=generator))
        for _ in range(steps)
    ]


def set_diagnostics(config, watch):
    from cadence.diagnostics import precheck
    from cadence.diagnostics.ledger import ledger
    from cadence.diagnostics.watchdog import active_watchdog, start_watchdog
    from cadence.state import PartialState

    on = config in ("cadence, ledger", "cadence, ledger+handshake")
    ledger.enabled = on
    precheck.handshake_enabled = config == "cadence, ledger+handshake"
    running = active_watchdog()
    if not on and running is not None:
        running.halt()
    if on and (running is None or not running.running):
        start_watchdog(PartialState(), watch)


def hand_written_loop(model, optimizer, data, log):
    for x, y in data:
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        if log:
            logged = loss.detach().clone()
            dist.all_reduce(logged)
            logged /= 2


def cadence_loop(accelerator, model, optimizer, data, log):
    for x, y in data:
        loss = torch.nn.functional.mse_loss(model(x), y)
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        if log:
            accelerator.reduce(loss.detach(), "mean")


def entered_cost(calls=200_000):
    """Nanoseconds per `with ledger.entered(...)` beyond an empty context manager (one process)."""
    from cadence.diagnostics.ledger import Ledger

    ledger, tensor = Ledger(), torch.ones(3)
    ledger.enabled = True
    timings = {}
    for name, make in (
        ("empty", nullcontext),
        ("ledger", lambda: ledger.entered("gather", tensor)),
    ):
        start = time.perf_counter()
        for _ in range(calls):
            with make():
                pass
        timings[name] = (time.perf_counter() - start) / calls * 1e9
    return timings["ledger"] - timings["empty"]


def worker(rank, port, rounds, steps, results):
    os.environ.update(RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE="2",
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))  # fmt: skip
    torch.set_num_threads(1)
    from cadence import Accelerator
    from cadence.diagnostics.watchdog import active_watchdog

    accelerator = Accelerator()
    watch = active_watchdog().settings
    torch.manual_seed(0)
    theirs = DistributedDataParallel(torch.nn.Linear(8, 1))
    their_optimizer = torch.optim.SGD(theirs.parameters(), lr=0.01)
    torch.manual_seed(0)
    ours = torch.nn.Linear(8, 1)
    ours, our_optimizer = accelerator.prepare(ours, torch.optim.SGD(ours.parameters(), lr=0.01))
    data = batches(steps)

    def run(config, log):
        set_diagnostics(config, watch)
        dist.barrier()
        start, start_cpu = time.perf_counter(), time.thread_time()
        if config == "hand-written":
            hand_written_loop(theirs, their_optimizer, data, log)
        else:
            cadence_loop(accelerator, ours, our_optimizer, data, log)
        return time.perf_counter() - start, time.thread_time() - start_cpu

    rows = []
    for log in (False, True):
        for config in CONFIGS:  # warm-up
            run(config, log)
        times = {config: [] for config in CONFIGS}
        for round_index in range(rounds):
            order = CONFIGS[round_index % len(CONFIGS) :] + CONFIGS[: round_index % len(CONFIGS)]
            for config in order:
                times[config].append(run(config, log))
        rows.append((log, times))
    set_diagnostics("cadence, ledger+handshake", watch)
    if rank == 0:
        results.append((rows, entered_cost()))
    dist.barrier()


def ratio(times, ours, theirs, index):
    return statistics.median(a[index] / b[index] for a, b in zip(times[ours], times[theirs]))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--steps", type=int, default=300)
    args = parser.parse_args()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    results = mp.Manager().list()
    mp.spawn(worker, args=(port, args.rounds, args.steps, results), nprocs=2)
    rows, entered_ns = results[0]
    print(
        f"ledger cost per `with ledger.entered(...)`: {entered_ns:.0f} ns (beyond an empty `with`)"
    )
    print(
        f"2 gloo processes, tiny model, {args.steps} steps per round, median of {args.rounds} interleaved rounds"
    )
    print("  time ratio, wall clock (CPU time of the main thread); lower is better")
    for log, times in rows:
        print(f"  {'step + reduce(loss) for logging' if log else 'plain training step'}:")
        step_ms = (
            statistics.median(t[0] for t in times["cadence, diagnostics off"]) / args.steps * 1e3
        )
        print(f"    (one step with diagnostics off: {step_ms:.2f} ms)")
        for ours, theirs in (
            ("cadence, ledger", "cadence, diagnostics off"),
            ("cadence, ledger+handshake", "cadence, diagnostics off"),
            ("cadence, diagnostics off", "hand-written"),
            ("cadence, ledger+handshake", "hand-written"),
        ):
            wall, cpu = ratio(times, ours, theirs, 0), ratio(times, ours, theirs, 1)
            print(f"    {ours:27s} / {theirs:25s} {wall:6.3f}  ({cpu:.3f})")


if __name__ == "__main__":
    main()
