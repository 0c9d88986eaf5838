"""Latency of Cadence's gather / reduce / gather_object / broadcast against the same calls written by hand
against torch.distributed, interleaved in one run on 2 gloo processes.

    python benchmarks/bench_collectives.py
"""

import os
import statistics
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

SIZES = {"1KB": 256, "1MB": 256 * 1024, "64MB": 16 * 1024 * 1024}  # float32 elements


def hand_gather(t):
    out = torch.empty(dist.get_world_size() * t.shape[0], dtype=t.dtype)
    dist.all_gather_into_tensor(out, t)
    return out


def hand_reduce(t):
    out = t.clone()
    dist.all_reduce(out)
    return out


def hand_gather_object(obj):
    out = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return [x for part in out for x in part]


def hand_broadcast(t):
    dist.broadcast(t, src=0)
    return t


def measure(fn, arg, repeats):
    dist.barrier()
    start = time.perf_counter()
    for _ in range(repeats):
        fn(arg)
    return (time.perf_counter() - start) / repeats


def worker(rank, port, results, handshake):
    os.environ["CADENCE_HANDSHAKE"] = handshake
    os.environ.update(
        RANK=str(rank),
        WORLD_SIZE="2",
        LOCAL_RANK=str(rank),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
    )
    torch.set_num_threads(1)
    import warnings

    warnings.simplefilter("ignore")
    from cadence import PartialState
    from cadence.utils import broadcast, gather, gather_object, reduce

    PartialState()
    pairs = {
        "gather": (gather, hand_gather),
        "reduce": (reduce, hand_reduce),
        "broadcast": (broadcast, hand_broadcast),
    }
    rows = []
    for size_name, numel in SIZES.items():
        tensor = torch.randn(numel)
        repeats = 200 if numel < 10_000 else (40 if numel < 1_000_000 else 6)
        for name, (ours, theirs) in pairs.items():
            ratios = []
            for _ in range(5):
                a = measure(ours, tensor, repeats)
                b = measure(theirs, tensor, repeats)
                ratios.append(a / b)
            rows.append((name, size_name, statistics.median(ratios)))
        payload = [list(range(numel // 64))]
        ratios = [
            measure(gather_object, payload, 20) / measure(hand_gather_object, payload, 20)
            for _ in range(5)
        ]
        rows.append(("gather_object", size_name, statistics.median(ratios)))
    if rank == 0:
        results.extend(rows)
    dist.barrier()
    dist.destroy_process_group()


def main():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    manager = mp.Manager()
    columns = {}
    for handshake in ("0", "1"):
        results = manager.list()
        mp.spawn(worker, args=(port, results, handshake), nprocs=2)
        columns[handshake] = list(results)
        port += 1
    print(
        "cadence / hand-written latency, 2 gloo processes, median of 5 interleaved rounds (target <= 1.05)"
    )
    print(
        "CADENCE_HANDSHAKE=1 (opt-in) adds a pre-collective handshake that turns mismatched calls into errors"
    )
    print(f"{'operation':15s} {'size':>6s}  {'default':>8s}  {'CADENCE_HANDSHAKE=1':>20s}")
    for (name, size, ratio), (_, _, opt_in) in zip(columns["0"], columns["1"]):
        print(f"{name:15s} {size:>6s}  {ratio:8.3f}  {opt_in:20.3f}")


if __name__ == "__main__":
    main()
