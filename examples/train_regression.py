"""A small regression model trained on every process of the job, the same script on 1 or N processes.

cadence launch --num_processes 2 examples/train_regression.py
python examples/train_regression.py            # one process
python examples/train_regression.py --epochs 1 # a shorter run (8 epochs by default)
"""

import argparse

import torch
from torch.utils.data import DataLoader, TensorDataset

from cadence import Accelerator
from cadence.utils import set_seed


def make_dataset(size: int = 512) -> TensorDataset:
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(size, 8, generator=generator)
    true_weights = torch.arange(1.0, 9.0).unsqueeze(1)
    y = x @ true_weights + 0.05 * torch.randn(size, 1, generator=generator)
    return TensorDataset(x, y)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=8, help="passes over the training set")
    epochs = parser.parse_args().epochs
    accelerator = Accelerator()
    set_seed(42)
    accelerator.print(
        f"Training on {accelerator.num_processes} process(es): {accelerator.distributed_type.value}, "
        f"device {accelerator.device}, mixed precision {accelerator.mixed_precision}"
    )
    train_loader = DataLoader(make_dataset(), batch_size=16, shuffle=True)
    eval_loader = DataLoader(make_dataset(100), batch_size=16)
    model = torch.nn.Linear(8, 1)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.5)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(
        optimizer, T_max=len(train_loader) * epochs
    )
    model, optimizer, train_loader, eval_loader, scheduler = accelerator.prepare(
        model, optimizer, train_loader, eval_loader, scheduler
    )
    for epoch in range(epochs):
        model.train()
        for x, y in train_loader:
            with accelerator.accumulate(model):
                loss = torch.nn.functional.mse_loss(model(x), y)
                accelerator.backward(loss)
                optimizer.step()
                scheduler.step()
                optimizer.zero_grad()
        model.eval()
        squared_errors = []
        with torch.no_grad():
            for x, y in eval_loader:
                predictions = model(x)
                predictions, targets = accelerator.gather_for_metrics((predictions, y))
                squared_errors.append((predictions - targets).pow(2))
        errors = torch.cat(squared_errors)
        accelerator.print(
            f"epoch {epoch}: eval MSE {errors.mean().item():.4f} over {len(errors)} samples"
        )
    accelerator.wait_for_everyone()
    weights = accelerator.unwrap_model(model).weight.detach().squeeze().tolist()
    accelerator.print("learned weights:", [round(w, 2) for w in weights])
    accelerator.end_training()


if __name__ == "__main__":
    main()
