"""Training converges on the launched processes: the regression model learns y = 2x + 3 to within
0.1 on each parameter (the data's noise has std 0.1), in fp32 or the mixed precision asked for."""

from __future__ import annotations

import argparse

import torch
from torch.utils.data import DataLoader

from cadence import Accelerator
from cadence.test_utils.scripts._checks import check
from cadence.test_utils.training import RegressionDataset, RegressionModel
from cadence.utils import set_seed


def training_function(mixed_precision: str, epochs: int) -> tuple[float, float]:
    """Train the regression model and return its learned (a, b)."""
    accelerator = Accelerator(mixed_precision=mixed_precision)
    set_seed(0)
    model = RegressionModel()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = DataLoader(
        RegressionDataset(a=2, b=3, length=256, seed=0), batch_size=16, shuffle=True
    )
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    for _ in range(epochs):
        for batch in loader:
            loss = torch.nn.functional.mse_loss(model(batch["x"]), batch["y"])
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
    inner = accelerator.unwrap_model(model)
    return inner.a.item(), inner.b.item()


def main() -> None:
    """Run every check of this script on this process; the first failure raises."""
    parser = argparse.ArgumentParser(description="Check that training converges.")
    parser.add_argument("--mixed_precision", default="no", choices=["no", "fp16", "bf16"])
    parser.add_argument("--num_epochs", type=int, default=4)
    args = parser.parse_args()
    a, b = training_function(args.mixed_precision, args.num_epochs)
    check(
        abs(a - 2) < 0.1 and abs(b - 3) < 0.1,
        f"learned a={a:.3f}, b={b:.3f}; expected 2 and 3 within 0.1",
    )
    print(f"Converged: a={a:.3f}, b={b:.3f}")


if __name__ == "__main__":
    main()
