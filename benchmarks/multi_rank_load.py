"""The multi-rank case of bench_resume_load.py (issue 46): N processes of one machine, every rank
loading the same checkpoint, against the raw mmap load on every rank, in the same run.

Each launch starts N gloo processes (torchrun's variables set by hand) that build the benchmark
state; the checkpoint was saved by N processes (so each rank has its own RNG file). Per launch:
the first load (the page cache warm: "first call in a new process"; or dropped first: "cold"),
then `--warm-loads` more loads in the same processes ("warm"). A load's time is the slowest rank's,
each rank timed from a common barrier. Raw: `torch.load(mmap=True, weights_only=True)` of the
model's and the optimizer's torch.save'd files on every rank, `load_state_dict` of both (the
optimizer's state stays in the mapping, as an expert's resume would leave it). Cadence:
`Accelerator.load_state` (every byte of the files checksummed once per machine, the ranks agreeing
on the result before anything is applied). Also timed: the first optimizer step after the first
load, where the raw load reads the optimizer's bytes it left in the mapping. BENCH_PROFILE=first or
=warm prints rank 0's profile of the first or of one more warm load (BENCH_SORT: the pstats order,
default tottime; BENCH_LINES: how many lines, default 15).
"""

from __future__ import annotations

import json
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch


def raw_mmap_load(model, optimizer, folder: Path) -> None:
    """What an expert writes to resume on every rank: mmap'd weights-only loads, load_state_dict."""
    model.load_state_dict(torch.load(folder / "model.pt", mmap=True, weights_only=True))
    optimizer.load_state_dict(torch.load(folder / "optimizer.pt", mmap=True, weights_only=True))


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def rank_main(variant: str, params: int, folder: Path, cold: bool, warm_loads: int, bench) -> None:
    """One rank of one launch (`variant`: 'save', 'raw' or 'cadence'); prints its times as JSON."""
    import torch.distributed as dist

    model, optimizer = bench.build_state(params)
    rank = int(os.environ["RANK"])
    if variant == "raw":
        dist.init_process_group("gloo")
        model = torch.nn.parallel.DistributedDataParallel(model)  # as a DDP script holds it
        source = folder / "plain"

        def load() -> None:
            raw_mmap_load(model.module, optimizer, source)

    else:
        import cadence

        accelerator = cadence.Accelerator(cpu=True)
        model, optimizer = accelerator.prepare(model, optimizer)
        source = folder / "ckpt"
        if variant == "save":
            accelerator.save_state(source)
            if rank == 0:
                bench.torch_save(accelerator.unwrap_model(model), optimizer, folder / "plain")
            accelerator.wait_for_everyone()
            print(json.dumps({"saved": True}), flush=True)
            return

        def load() -> None:
            accelerator.load_state(source)

    def timed_load() -> float:
        dist.barrier()
        start = time.perf_counter()
        load()
        return time.perf_counter() - start

    parameters = list(model.parameters())
    for p in parameters:  # the first step's gradients, made before anything is timed
        p.grad = torch.zeros_like(p)

    def timed_step() -> float:
        """The first optimizer step after the load: where the raw load reads the optimizer's
        bytes it left in the mapping (the verified load read them to hash them)."""
        dist.barrier()
        start = time.perf_counter()
        optimizer.step()
        return time.perf_counter() - start

    if cold:
        if rank == 0:
            bench.drop_from_cache(source)
        dist.barrier()
    start_cpu = time.process_time()
    if os.environ.get("BENCH_PROFILE") == "first" and rank == 0:  # where the first call's time goes
        first = _profiled(timed_load)
    else:
        first = timed_load()
    first_cpu = time.process_time() - start_cpu
    first_step = timed_step()
    warm = []
    for _ in range(warm_loads):
        start_cpu = time.process_time()
        warm.append((timed_load(), time.process_time() - start_cpu))
    if os.environ.get("BENCH_PROFILE") == "warm":  # where a warm load's time goes
        _profiled(timed_load) if rank == 0 else timed_load()
    load_average = float(open("/proc/loadavg").read().split()[0])
    print(
        json.dumps(
            {
                "first": first,
                "first_cpu": first_cpu,
                "first_step": first_step,
                "warm": warm,
                "loadavg": load_average,
            }
        ),
        flush=True,
    )
    dist.barrier()
    dist.destroy_process_group()


def _profiled(fn) -> float:
    import cProfile
    import pstats

    profile = cProfile.Profile()
    result = profile.runcall(fn)
    pstats.Stats(profile, stream=sys.stderr).sort_stats(
        os.environ.get("BENCH_SORT", "tottime")
    ).print_stats(int(os.environ.get("BENCH_LINES", "15")))
    return result


def launch(script: str, variant: str, processes: int, params: int, folder: Path, cold: bool,
           warm_loads: int) -> list[dict]:  # fmt: skip
    """Run one launch of `processes` ranks; each rank's JSON line, in rank order."""
    port = _free_port()
    children = []
    for rank in range(processes):
        env = dict(
            os.environ,
            RANK=str(rank),
            WORLD_SIZE=str(processes),
            LOCAL_RANK=str(rank),
            LOCAL_WORLD_SIZE=str(processes),
            GROUP_RANK="0",
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
            OMP_NUM_THREADS="1",
        )
        command = [sys.executable, script, "--rank-child", variant, "--params", str(params)]
        command += ["--dir", str(folder), "--warm-loads", str(warm_loads)]
        command += ["--cold"] if cold else []
        children.append(
            subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        )
    out = []
    for child in children:
        stdout, stderr = child.communicate(timeout=900)
        if os.environ.get("BENCH_PROFILE"):
            sys.stderr.write(stderr.decode()[-20000:])
        if child.returncode:
            raise RuntimeError(f"rank of {variant} failed:\n{stderr.decode()[-3000:]}")
        out.append(json.loads(stdout.decode().strip().splitlines()[-1]))
    return out


def _ratio_line(label: str, ours: list[float], raw: list[float]) -> str:
    ratios = [o / r for o, r in zip(ours, raw)]
    return (
        f"{label:40s} raw {statistics.median(raw):.3f}s  cadence {statistics.median(ours):.3f}s"
        f"  cadence / raw {statistics.median(ratios):.2f}x ({min(ratios):.2f}-{max(ratios):.2f})"
    )


def _print_ratios(processes: int, times: dict, kinds, cpu: dict | None = None) -> None:
    """One line per kind of load: Cadence's time against the raw load's (and, given `cpu`, a line
    of the CPU time of all ranks under it)."""
    for kind, label in kinds:
        print(
            _ratio_line(
                f"{processes} processes, {label}", times[(kind, "cadence")], times[(kind, "raw")]
            )
        )
        if cpu is not None:
            print(
                _ratio_line("    CPU time, all ranks", cpu[(kind, "cadence")], cpu[(kind, "raw")])
            )


def multi_rank_rounds(script: str, params: int, rounds: int, process_counts: list[int],
                      base: Path, warm_loads: int, bench) -> None:  # fmt: skip
    """The multi-rank modes, raw and Cadence interleaved (the order reversed every round)."""
    for processes in process_counts:
        folder = base / f"ranks{processes}"
        folder.mkdir(parents=True, exist_ok=True)
        launch(script, "save", processes, params, folder, False, 0)
        times: dict[tuple[str, str], list[float]] = {}
        cpu: dict[tuple[str, str], list[float]] = {}
        loads: list[float] = []
        for r in range(rounds):
            variants = ["raw", "cadence"] if r % 2 == 0 else ["cadence", "raw"]
            for cold in (False, True):
                for variant in variants:
                    if not cold:
                        bench.warm(folder / ("plain" if variant == "raw" else "ckpt"))
                    ranks = launch(script, variant, processes, params, folder, cold, warm_loads)
                    first = max(o["first"] for o in ranks)
                    warm = statistics.median(
                        max(o["warm"][i][0] for o in ranks) for i in range(warm_loads)
                    )
                    kind = "cold" if cold else "first"
                    times.setdefault((kind, variant), []).append(first)
                    # the resume until the first step is done (the raw load's deferred reads)
                    times.setdefault((kind + "+step", variant), []).append(
                        max(o["first"] + o["first_step"] for o in ranks)
                    )
                    times.setdefault(("warm", variant), []).append(warm)
                    # CPU time of all ranks together: what the load costs the machine
                    cpu.setdefault((kind, variant), []).append(sum(o["first_cpu"] for o in ranks))
                    cpu.setdefault(("warm", variant), []).append(
                        statistics.median(
                            sum(o["warm"][i][1] for o in ranks) for i in range(warm_loads)
                        )
                    )
                    loads += [o["loadavg"] for o in ranks]
                    print(
                        f"{processes} processes round {r} {variant:8s} "
                        f"{'cold' if cold else 'first call':10s} {first:.3f}s, then warm "
                        f"{warm:.3f}s (load average {ranks[0]['loadavg']:.2f})",
                        flush=True,
                    )
        print()
        loads_by_kind = (
            ("warm", "warm page cache"),
            ("first", "first call in a new process"),
            ("cold", "cold page cache"),
        )
        _print_ratios(processes, times, loads_by_kind, cpu)
        _print_ratios(
            processes,
            times,
            (
                ("first+step", "first call + first optimizer step"),
                ("cold+step", "cold + first optimizer step"),
            ),
        )
        print(
            f"load average during the loads: median {statistics.median(loads):.2f} "
            f"({min(loads):.2f}-{max(loads):.2f})\n",
            flush=True,
        )
