"""Cadence's training step uses no more GPU memory than the same step in plain PyTorch (within
10% and 1 MiB). Needs CUDA: on a machine without it the script says so and exits with code 0."""

from __future__ import annotations

import sys

import torch

from cadence import Accelerator
from cadence.test_utils.scripts._checks import check


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(1024, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 1024)
    )


def _training_peak(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer, backward, batch: torch.Tensor
) -> int:  # type: ignore[no-untyped-def]
    """Peak CUDA memory of one training step, after a first step created the optimizer states."""

    def step() -> None:
        backward(model(batch).pow(2).mean())
        optimizer.step()
        optimizer.zero_grad()

    step()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    step()
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated()


def main() -> None:
    """Run every check of this script on this process; the first failure raises."""
    if not torch.cuda.is_available():
        print(
            "test_peak_memory_usage: SKIPPED, this check measures CUDA memory and no GPU is available."
        )
        sys.exit(0)
    device = torch.device("cuda", torch.cuda.current_device())
    batch = torch.randn(64, 1024, device=device)
    plain = _model().to(device)
    plain_peak = _training_peak(
        plain, torch.optim.AdamW(plain.parameters()), lambda loss: loss.backward(), batch
    )
    plain = None
    torch.cuda.empty_cache()

    accelerator = Accelerator()
    model = _model()
    model, optimizer = accelerator.prepare(model, torch.optim.AdamW(model.parameters()))
    cadence_peak = _training_peak(model, optimizer, accelerator.backward, batch)
    limit = plain_peak * 1.1 + 2**20
    check(
        cadence_peak <= limit,
        f"peak {cadence_peak} bytes with Cadence, {plain_peak} in plain PyTorch",
    )
    print(f"Peak memory: {cadence_peak} bytes (plain PyTorch: {plain_peak}).")


if __name__ == "__main__":
    main()
