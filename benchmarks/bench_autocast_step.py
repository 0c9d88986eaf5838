"""Per-step overhead of Cadence's mixed precision path on one CPU process: a whole training step
(forward under autocast, fp32 outputs, backward, optimizer step) through a prepared model and optimizer,
against the same step written by hand, interleaved (Cadence, hand-written, ...), median of the ratios.

    python benchmarks/bench_autocast_step.py [--rounds 9] [--steps 2000]

Target (issue 15, on CUDA with bench_gpu.py): tiny model <= 1.02x in bf16. Here on the CPU the
numbers say how much the Python wrapper adds around a step whose own cost is small.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Linear(8, 1)


def hand_written(precision: str, steps: int, x: torch.Tensor, y: torch.Tensor) -> float:
    model = _model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    start = time.perf_counter()
    for _ in range(steps):
        if precision == "bf16":
            with torch.autocast("cpu", dtype=torch.bfloat16):
                out = model(x)
            out = out.float()
        else:
            out = model(x)
        F.mse_loss(out, y).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return time.perf_counter() - start


def with_cadence(precision: str, steps: int, x: torch.Tensor, y: torch.Tensor) -> float:
    from cadence import Accelerator
    from cadence.state import reset_state

    reset_state()
    accelerator = Accelerator(cpu=True, mixed_precision=precision)
    model = _model()
    model, optimizer = accelerator.prepare(model, torch.optim.SGD(model.parameters(), lr=0.01))
    start = time.perf_counter()
    for _ in range(steps):
        accelerator.backward(F.mse_loss(model(x), y))
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    elapsed = time.perf_counter() - start
    accelerator.free_memory()
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--steps", type=int, default=2000)
    args = parser.parse_args()
    torch.set_num_threads(1)
    x, y = torch.randn(32, 8), torch.randn(32, 1)
    for precision in ("no", "bf16"):
        with_cadence(precision, 200, x, y)  # warm-up
        hand_written(precision, 200, x, y)
        ratios, ours, theirs = [], [], []
        for _ in range(args.rounds):
            a = with_cadence(precision, args.steps, x, y)
            b = hand_written(precision, args.steps, x, y)
            ratios.append(a / b)
            ours.append(a / args.steps * 1e6)
            theirs.append(b / args.steps * 1e6)
        label = "fp32" if precision == "no" else precision
        print(
            f"tiny model step, {label}: {statistics.median(ratios):.3f}x hand-written "
            f"(Cadence {statistics.median(ours):.1f} us/step, hand-written "
            f"{statistics.median(theirs):.1f} us/step)"
        )


if __name__ == "__main__":
    main()
