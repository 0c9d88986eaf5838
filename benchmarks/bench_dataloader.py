"""Prepared DataLoader vs a plain DataLoader + DistributedSampler: samples per second per process.

2 processes on gloo, 200k small in-memory samples, batch 64, shuffled. The two loaders are timed in
alternating rounds in the same processes (so machine noise hits both alike); the ratio printed is
prepared / plain samples per second (target >= 0.98), measured on the CPU time of each process's main thread (robust
to other load on the machine) and, for information, on wall-clock time.

    python benchmarks/bench_dataloader.py [--rounds 12] [--samples 200000] [--batch-size 64]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def _epoch_time(loader, epoch: int) -> tuple[float, float, int]:
    if hasattr(loader, "set_epoch"):
        loader.set_epoch(epoch)
    elif hasattr(loader.sampler, "set_epoch"):
        loader.sampler.set_epoch(epoch)
    dist.barrier()
    start, start_cpu = time.perf_counter(), time.thread_time()
    samples = 0
    for features, _labels in loader:
        samples += features.shape[0]
    return time.perf_counter() - start, time.thread_time() - start_cpu, samples


def _worker(rank: int, world_size: int, port: int, args: argparse.Namespace, results) -> None:
    os.environ.update(
        RANK=str(rank),
        WORLD_SIZE=str(world_size),
        LOCAL_RANK=str(rank),
        LOCAL_WORLD_SIZE=str(world_size),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
    )
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

    from cadence.data import prepare_data_loader
    from cadence.state import PartialState

    torch.manual_seed(0)
    dataset = TensorDataset(torch.randn(args.samples, 8), torch.randint(0, 10, (args.samples,)))
    plain = DataLoader(
        dataset,
        batch_size=args.batch_size,
        sampler=DistributedSampler(
            dataset, num_replicas=world_size, rank=rank, shuffle=True, seed=0
        ),
    )
    state = PartialState()
    prepared = prepare_data_loader(
        DataLoader(dataset, batch_size=args.batch_size, shuffle=True),
        device=state.device,
        put_on_device=True,
        rng_types=["generator"],
    )
    _epoch_time(plain, 0), _epoch_time(prepared, 0)  # warm up
    measured = {"plain": [], "prepared": []}  # (wall rate, cpu rate) per round
    for round_index in range(args.rounds):
        order = [("plain", plain), ("prepared", prepared)]
        if round_index % 2:
            order.reverse()
        for name, loader in order:
            wall, cpu, samples = _epoch_time(loader, round_index + 1)
            measured[name].append((samples / wall, samples / cpu))
    if rank == 0:
        results.put(measured)
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--samples", type=int, default=200_000)
    parser.add_argument("--batch-size", type=int, default=64)
    args = parser.parse_args()
    from socket import socket

    with socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    context = mp.get_context("spawn")
    results = context.Queue()
    processes = [
        context.Process(target=_worker, args=(rank, 2, port, args, results)) for rank in range(2)
    ]
    for process in processes:
        process.start()
    measured = results.get()
    for process in processes:
        process.join()
    for index, clock in enumerate(("wall clock", "CPU time")):
        plain_rate = max(rates[index] for rates in measured["plain"])
        prepared_rate = max(rates[index] for rates in measured["prepared"])
        ratios = [p[index] / q[index] for p, q in zip(measured["prepared"], measured["plain"])]
        print(
            f"[{clock}] plain DataLoader + DistributedSampler: {plain_rate:,.0f} samples/s (best round)"
        )
        print(
            f"[{clock}] prepared DataLoader (cadence):          {prepared_rate:,.0f} samples/s (best round)"
        )
        print(
            f"[{clock}] ratio prepared / plain: best rounds {prepared_rate / plain_rate:.3f}, "
            f"median of per-round ratios {statistics.median(ratios):.3f}"
        )


if __name__ == "__main__":
    main()
