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


def _peak_of(step) -> int:  # type: ignore[no-untyped-def]
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    step()
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated()


def main() -> None:
    if not torch.cuda.is_available():
        print(
            "test_peak_memory_usage: SKIPPED, this check measures CUDA memory and no GPU is available."
        )
        sys.exit(0)
    device = torch.device("cuda", torch.cuda.current_device())
    batch = torch.randn(64, 1024, device=device)

    plain = _model().to(device)
    plain_optimizer = torch.optim.AdamW(plain.parameters())

    def plain_step() -> None:
        plain(batch).pow(2).mean().backward()
        plain_optimizer.step()
        plain_optimizer.zero_grad()

    plain_step()  # optimizer states exist from here on, in both runs
    plain_peak = _peak_of(plain_step)
    del plain, plain_optimizer
    torch.cuda.empty_cache()

    accelerator = Accelerator()
    model, optimizer = accelerator.prepare(_model(), torch.optim.AdamW(_model().parameters()))

    def cadence_step() -> None:
        accelerator.backward(model(batch).pow(2).mean())
        optimizer.step()
        optimizer.zero_grad()

    cadence_step()
    cadence_peak = _peak_of(cadence_step)
    limit = plain_peak * 1.1 + 2**20
    check(
        cadence_peak <= limit,
        f"peak {cadence_peak} bytes with Cadence, {plain_peak} in plain PyTorch",
    )
    print(f"Peak memory: {cadence_peak} bytes (plain PyTorch: {plain_peak}).")


if __name__ == "__main__":
    main()
