"""Per-step cost of Cadence's training loop against the same loop written by hand with DDP and a
DistributedSampler, interleaved in one run on 2 gloo processes. Also the prepared DataLoader alone
against a plain DataLoader + DistributedSampler.

    python benchmarks/bench_training_step.py [--rounds 7]

Targets: tiny model <= 1.02x, small MLP <= 1.01x hand-written; dataloader >= 0.98x its samples/s.
"""

import argparse
import os
import socket
import statistics
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

MODELS = {
    "tiny": lambda: torch.nn.Linear(8, 1),
    "mlp": lambda: torch.nn.Sequential(
        torch.nn.Linear(64, 256),
        torch.nn.ReLU(),
        torch.nn.Linear(256, 256),
        torch.nn.ReLU(),
        torch.nn.Linear(256, 1),
    ),
}
FEATURES = {"tiny": 8, "mlp": 64}


def dataset(features, size):
    generator = torch.Generator().manual_seed(0)
    return TensorDataset(
        torch.randn(size, features, generator=generator), torch.randn(size, 1, generator=generator)
    )


def hand_written(name, data, batch_size, epochs):
    model = DistributedDataParallel(MODELS[name]())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    sampler = DistributedSampler(data, shuffle=True)
    loader = DataLoader(data, batch_size=batch_size, sampler=sampler)
    start = time.perf_counter()
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        for x, y in loader:
            optimizer.zero_grad()
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()
            optimizer.step()
    return time.perf_counter() - start


def with_cadence(accelerator, name, data, batch_size, epochs):
    model = MODELS[name]()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = DataLoader(data, batch_size=batch_size, shuffle=True)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    start = time.perf_counter()
    for _ in range(epochs):
        for x, y in loader:
            optimizer.zero_grad()
            loss = torch.nn.functional.mse_loss(model(x), y)
            accelerator.backward(loss)
            optimizer.step()
    elapsed = time.perf_counter() - start
    accelerator.free_memory()
    return elapsed


def plain_loader(data, batch_size):
    sampler = DistributedSampler(data, shuffle=True)
    loader = DataLoader(data, batch_size=batch_size, sampler=sampler)
    start = time.perf_counter()
    count = sum(x.shape[0] for x, _ in loader)
    return count / (time.perf_counter() - start)


def cadence_loader(accelerator, data, batch_size):
    loader = accelerator.prepare(DataLoader(data, batch_size=batch_size, shuffle=True))
    start = time.perf_counter()
    count = sum(x.shape[0] for x, _ in loader)
    rate = count / (time.perf_counter() - start)
    accelerator.free_memory()
    return rate


def worker(rank, port, rounds, results):
    os.environ.update(RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE="2",
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))  # fmt: skip
    torch.set_num_threads(1)
    from cadence import Accelerator

    accelerator = Accelerator()
    rows = []
    for name, size, batch, epochs in (("tiny", 16384, 32, 1), ("mlp", 8192, 64, 1)):
        data = dataset(FEATURES[name], size)
        hand_written(name, data, batch, 1)  # warm-up
        with_cadence(accelerator, name, data, batch, 1)
        ratios = []
        for _ in range(rounds):
            dist.barrier()
            ours = with_cadence(accelerator, name, data, batch, epochs)
            dist.barrier()
            theirs = hand_written(name, data, batch, epochs)
            ratios.append(ours / theirs)
        rows.append(
            (
                f"training step, {name} model",
                "time ratio (lower is better)",
                statistics.median(ratios),
            )
        )
    data = dataset(4, 200_000)
    ratios = []
    for _ in range(rounds):
        dist.barrier()
        ours = cadence_loader(accelerator, data, 64)
        dist.barrier()
        theirs = plain_loader(data, 64)
        ratios.append(ours / theirs)
    rows.append(
        (
            "prepared DataLoader alone",
            "samples/s ratio (higher is better)",
            statistics.median(ratios),
        )
    )
    if rank == 0:
        results.extend(rows)
    dist.barrier()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=7)
    rounds = parser.parse_args().rounds
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    results = mp.Manager().list()
    mp.spawn(worker, args=(port, rounds, results), nprocs=2)
    print("cadence / hand-written DDP, 2 gloo processes, median of interleaved rounds")
    for what, unit, ratio in results:
        print(f"  {what:32s} {ratio:6.3f}  ({unit})")


if __name__ == "__main__":
    main()
