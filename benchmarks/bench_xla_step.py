"""Per-step time and losses of one small training on torch_xla's CPU device against eager CPU: eager CPU
(plain torch), a hand-written torch_xla loop, and Cadence's Accelerator on XLA. Run in the XLA venv:

    PJRT_DEVICE=CPU .venv-xla/bin/python benchmarks/bench_xla_step.py [--steps 60] [--warmup 10]

Each step is timed until its graph has run (`xm.wait_device_ops()`); the figure is the median over the
steps after the warm-up (the first XLA steps compile). Losses are compared step by step with eager CPU.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

IN, HIDDEN, BATCH = 64, 256, 64


def model_and_data(steps: int) -> tuple[torch.nn.Module, list[tuple[torch.Tensor, torch.Tensor]]]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(IN, HIDDEN), torch.nn.ReLU(),
        torch.nn.Linear(HIDDEN, HIDDEN), torch.nn.ReLU(),
        torch.nn.Linear(HIDDEN, 1),
    )  # fmt: skip
    generator = torch.Generator().manual_seed(1)
    batches = []
    for _ in range(steps):
        x = torch.randn(BATCH, IN, generator=generator)
        batches.append((x, x.sum(dim=1, keepdim=True).sin()))
    return model, batches


def eager_cpu(steps: int) -> tuple[list[float], list[float]]:
    model, batches = model_and_data(steps)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    times, losses = [], []
    for x, y in batches:
        start = time.perf_counter()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
        times.append(time.perf_counter() - start)
    return times, losses


def hand_written_xla(steps: int) -> tuple[list[float], list[float]]:
    import torch_xla
    import torch_xla.core.xla_model as xm

    device = torch_xla.device()
    model, batches = model_and_data(steps)
    model.to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    times, losses = [], []
    for x, y in batches:
        start = time.perf_counter()
        x, y = x.to(device), y.to(device)
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        torch_xla.sync()
        xm.wait_device_ops()
        times.append(time.perf_counter() - start)
        losses.append(loss)
    return times, [loss.item() for loss in losses]


def cadence_xla(steps: int) -> tuple[list[float], list[float]]:
    import torch_xla.core.xla_model as xm

    from cadence import Accelerator
    from cadence.state import reset_state

    reset_state()
    accelerator = Accelerator()
    model, batches = model_and_data(steps)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    loader = torch.utils.data.DataLoader(batches, batch_size=None)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    times, losses = [], []
    iterator = iter(loader)
    for _ in range(steps):
        start = time.perf_counter()
        x, y = next(iterator)
        loss = torch.nn.functional.mse_loss(model(x), y)
        accelerator.backward(loss)
        optimizer.step()  # Cadence cuts the graph after the step
        optimizer.zero_grad()
        xm.wait_device_ops()
        times.append(time.perf_counter() - start)
        losses.append(loss)
    return times, [loss.item() for loss in losses]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--warmup", type=int, default=10)
    args = parser.parse_args()
    # The XLA runs first: a CPU backward before the first XLA one leaves torch's autograd engine without
    # a queue for XLA devices (a torch / torch_xla limitation).
    runs = {
        "torch_xla by hand": hand_written_xla(args.steps),
        "Cadence on XLA": cadence_xla(args.steps),
    }
    runs = {"eager CPU": eager_cpu(args.steps), **runs}
    cpu_losses = runs["eager CPU"][1]
    print(f"MLP {IN}-{HIDDEN}-{HIDDEN}-1, batch {BATCH}, AdamW; median of {args.steps - args.warmup} "
          f"steps after {args.warmup} warm-up steps")  # fmt: skip
    for name, (times, losses) in runs.items():
        median = statistics.median(times[args.warmup :]) * 1e3
        diff = max(abs(a - b) for a, b in zip(losses, cpu_losses))
        print(
            f"{name:>18}: {median:7.3f} ms/step  first step {times[0] * 1e3:8.1f} ms  "
            f"max |loss - eager CPU loss| = {diff:.2e}"
        )


if __name__ == "__main__":
    main()
