"""Big-model loading and offloaded inference: Cadence vs the reference (accelerate), in one run.

A ~1 GB model (blocks of two 2048x4096 linears, float32) is saved once as sharded safetensors (8
shards). Then, in fresh processes, alternating Cadence and the reference (run with the reference's
own interpreter, so Cadence never imports it):
  load cpu:   init_empty_weights + load_checkpoint_and_dispatch(device_map={"": "cpu"}); both
              libraries leave the weights memory-mapped, so the first forward pays the reading
  load fp16:  the same with dtype=float16: every weight is read and cast during the load
  load disk:  the same with the second half of the blocks mapped to "disk" (offload folder)
  forward:    tokens/s of that half-disk model (each forward reads the disk half back), best of 5
and for each load the peak resident memory it added (VmHWM), against largest shard + what stays
in memory. The files are read once before timing so both sides read from the page cache.

Run: .venv/bin/python benchmarks/bench_big_model.py [--size-mb 1024] [--rounds 3]
     [--reference-python /work/ref-venv/bin/python]
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
import time

import torch
from torch import nn

WIDTH = 2048


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up = nn.Linear(WIDTH, 2 * WIDTH)
        self.down = nn.Linear(2 * WIDTH, WIDTH)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(torch.relu(self.up(x)))


class Model(nn.Module):
    def __init__(self, blocks: int) -> None:
        super().__init__()
        self.emb = nn.Embedding(256, WIDTH)
        self.blocks = nn.ModuleList([Block() for _ in range(blocks)])
        self.head = nn.Linear(WIDTH, 256)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.emb(ids)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def block_count(size_mb: int) -> int:
    per_block = (2 * WIDTH * 2 * WIDTH + 3 * WIDTH) * 4
    return max(2, round(size_mb * 2**20 / per_block))


def half_disk_map(blocks: int) -> dict[str, str]:
    device_map = {"emb": "cpu", "head": "cpu"}
    for i in range(blocks):
        device_map[f"blocks.{i}"] = "cpu" if i < blocks // 2 else "disk"
    return device_map


# ----------------------------------------------------------------------------- worker (one library)
def _status(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(field)


def worker(library: str, task: str, checkpoint: str, blocks: int, scratch: str) -> dict:
    if library == "cadence":
        from cadence import init_empty_weights, load_checkpoint_and_dispatch
    else:
        from accelerate import init_empty_weights, load_checkpoint_and_dispatch
    torch.set_num_threads(max(1, (os.cpu_count() or 2)))
    with init_empty_weights():
        model = Model(blocks)
    device_map = half_disk_map(blocks) if task == "load_disk" else {"": "cpu"}
    dtype = torch.float16 if task == "load_fp16" else None
    offload = os.path.join(scratch, f"offload-{library}")
    shutil.rmtree(offload, ignore_errors=True)
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # VmHWM := VmRSS
    before = _status("VmRSS")
    start = time.perf_counter()
    model = load_checkpoint_and_dispatch(
        model, checkpoint, device_map=device_map, offload_folder=offload, dtype=dtype
    )
    load_s = time.perf_counter() - start
    result = {"load_s": load_s, "peak_added": _status("VmHWM") - before}
    ids = torch.randint(0, 256, (4, 32), generator=torch.Generator().manual_seed(0))
    if dtype is not None:
        model.float()  # the forward in float32 (CPU matmuls in float16 are slow)
    with torch.no_grad():
        start = time.perf_counter()
        model(ids)  # the first forward touches every weight (both libraries map the shards lazily)
        result["first_forward_s"] = time.perf_counter() - start
        result["peak_with_forward"] = _status("VmHWM") - before
        if task == "load_disk":
            # the best of 5 steps: the machine is shared, the slowest steps measure the neighbours
            steps = []
            for _ in range(5):
                start = time.perf_counter()
                model(ids)
                steps.append(time.perf_counter() - start)
            result["tokens_per_s"] = ids.numel() / min(steps)
    shutil.rmtree(offload, ignore_errors=True)
    return result


# ----------------------------------------------------------------------------- driver
def make_checkpoint(folder: str, blocks: int) -> tuple[int, int]:
    from safetensors.torch import save_file

    torch.manual_seed(0)
    model = Model(blocks)
    state = model.state_dict()
    names = list(state)
    shards = 8
    per = -(-len(names) // shards)
    weight_map = {}
    for i in range(shards):
        part = names[i * per : (i + 1) * per]
        if not part:
            break
        file = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        save_file(
            {k: state[k].contiguous() for k in part},
            os.path.join(folder, file),
            metadata={"format": "pt"},
        )
        weight_map.update(dict.fromkeys(part, file))
    total = sum(t.numel() * t.element_size() for t in state.values())
    with open(os.path.join(folder, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f)
    largest = max(os.path.getsize(os.path.join(folder, f)) for f in set(weight_map.values()))
    return total, largest


def run_worker(
    python: str, library: str, task: str, checkpoint: str, blocks: int, scratch: str
) -> dict:
    env = dict(os.environ)
    if library == "reference":
        env.pop("PYTHONPATH", None)  # the reference's interpreter must not see Cadence
    out = subprocess.run(
        [
            python,
            os.path.abspath(__file__),
            "--worker",
            library,
            task,
            checkpoint,
            str(blocks),
            scratch,
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=1800,
    )
    if out.returncode != 0:
        raise RuntimeError(f"{library} {task} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--size-mb", type=int, default=1024)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--reference-python", default="/work/ref-venv/bin/python")
    parser.add_argument("--worker", nargs=5)
    args = parser.parse_args()
    if args.worker:
        library, task, checkpoint, blocks, scratch = args.worker
        print(json.dumps(worker(library, task, checkpoint, int(blocks), scratch)))
        return
    blocks = block_count(args.size_mb)
    with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_TMP")) as scratch:
        checkpoint = os.path.join(scratch, "ckpt")
        os.makedirs(checkpoint)
        total, largest = make_checkpoint(checkpoint, blocks)
        for name in os.listdir(checkpoint):  # into the page cache for both sides
            with open(os.path.join(checkpoint, name), "rb") as f:
                while f.read(1 << 24):
                    pass
        print(
            f"model {total / 2**20:.0f} MiB in {blocks} blocks, largest shard {largest / 2**20:.0f} MiB"
        )
        pythons = {"cadence": sys.executable, "reference": args.reference_python}
        results: dict[tuple[str, str], list[dict]] = {}
        for _ in range(args.rounds):
            for task in ("load_cpu", "load_fp16", "load_disk"):
                for library in ("reference", "cadence"):
                    result = run_worker(
                        pythons[library], library, task, checkpoint, blocks, scratch
                    )
                    results.setdefault((library, task), []).append(result)

    def median(library: str, task: str, key: str) -> float:
        return statistics.median(r[key] for r in results[(library, task)])

    disk_bytes = (blocks - blocks // 2) * (2 * WIDTH * 2 * WIDTH + 3 * WIDTH) * 4
    in_memory = {"load_cpu": total, "load_fp16": total // 2, "load_disk": total - disk_bytes}
    print(f"{'':30s}{'reference':>12s}{'cadence':>12s}{'ratio':>8s}")

    def row(label: str, ref: float, cad: float, scale: float = 1.0, ratio: bool = True) -> None:
        end = f"{cad / ref:8.2f}" if ratio else ""
        print(f"{label:30s}{ref / scale:12.2f}{cad / scale:12.2f}{end}")

    tasks = (
        ("load_cpu", "load, all on CPU"),
        ("load_fp16", "load as float16, CPU"),
        ("load_disk", "load, half on disk"),
    )
    for task, label in tasks:
        row(f"{label} (s)", median("reference", task, "load_s"), median("cadence", task, "load_s"))
        row(
            "  first forward (s)",
            median("reference", task, "first_forward_s"),
            median("cadence", task, "first_forward_s"),
        )
        bound = largest + in_memory[task]
        for key, name in (
            ("peak_added", "peak RSS, load"),
            ("peak_with_forward", "peak RSS, + forward"),
        ):
            ref_m, cad_m = median("reference", task, key), median("cadence", task, key)
            row(f"  {name} (MiB)", ref_m, cad_m, scale=2**20)
            row("    / (largest shard + kept)", ref_m / bound, cad_m / bound, ratio=False)
    ref_t, cad_t = (
        median("reference", "load_disk", "tokens_per_s"),
        median("cadence", "load_disk", "tokens_per_s"),
    )
    row("offloaded forward (tok/s)", ref_t, cad_t)
    print(f"{'  time ratio (cadence/ref)':30s}{'':24s}{ref_t / cad_t:8.2f}")


if __name__ == "__main__":
    main()
