"""save_state / load_state on the launched processes: resuming from a checkpoint continues
training exactly, automatic checkpoint naming counts up, and `total_limit` prunes old ones."""

from __future__ import annotations

import os
import tempfile

import torch
from torch.utils.data import DataLoader

from cadence import Accelerator
from cadence.runtime.state import AcceleratorState, GradientState
from cadence.test_utils.scripts._checks import check
from cadence.test_utils.training import RegressionDataset, RegressionModel
from cadence.utils import ProjectConfiguration, broadcast_object_list, set_seed


def make(project_dir: str, total_limit: int | None = None) -> tuple:
    """A fresh Accelerator with a prepared regression model, optimizer, scheduler and loader."""
    AcceleratorState._reset_state(True)
    GradientState._reset_state()
    config = ProjectConfiguration(
        project_dir=project_dir, automatic_checkpoint_naming=True, total_limit=total_limit
    )
    accelerator = Accelerator(cpu=True, project_config=config)
    set_seed(0)
    model = RegressionModel()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.5)
    loader = DataLoader(RegressionDataset(length=32, seed=1), batch_size=4, shuffle=True)
    return accelerator, *accelerator.prepare(model, optimizer, scheduler, loader)


def train(accelerator: Accelerator, model, optimizer, scheduler, loader, epochs: int) -> None:  # type: ignore[no-untyped-def]
    """Train for `epochs` passes over the loader."""
    for _ in range(epochs):
        for batch in loader:
            loss = torch.nn.functional.mse_loss(model(batch["x"]), batch["y"])
            accelerator.backward(loss)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()


def parameters(accelerator: Accelerator, model) -> tuple[float, float]:  # type: ignore[no-untyped-def]
    """The (a, b) parameters of the regression model."""
    inner = accelerator.unwrap_model(model)
    return inner.a.item(), inner.b.item()


def test_resume_continues_exactly(project_dir: str) -> None:
    """Check resume continues exactly (raises AssertionError on failure)."""
    accelerator, model, optimizer, scheduler, loader = make(project_dir)
    train(accelerator, model, optimizer, scheduler, loader, 1)
    accelerator.save_state()
    train(accelerator, model, optimizer, scheduler, loader, 1)
    uninterrupted = parameters(accelerator, model)

    accelerator, model, optimizer, scheduler, loader = make(project_dir)
    accelerator.load_state(os.path.join(project_dir, "checkpoints", "checkpoint_0"))
    train(accelerator, model, optimizer, scheduler, loader, 1)
    resumed = parameters(accelerator, model)
    check(
        all(abs(u - r) < 1e-6 for u, r in zip(uninterrupted, resumed)),
        f"resumed training gave {resumed}, uninterrupted {uninterrupted}",
    )


def test_total_limit_prunes(project_dir: str) -> None:
    """Check total limit prunes (raises AssertionError on failure)."""
    accelerator, model, optimizer, scheduler, loader = make(project_dir, total_limit=2)
    for _ in range(3):
        train(accelerator, model, optimizer, scheduler, loader, 1)
        accelerator.save_state()
    accelerator.wait_for_everyone()
    kept = sorted(os.listdir(os.path.join(project_dir, "checkpoints")))
    check(kept == ["checkpoint_1", "checkpoint_2"], f"total_limit=2 kept {kept}")


def main() -> None:
    """Run every check of this script on this process; the first failure raises."""
    with tempfile.TemporaryDirectory() as tmp:
        shared = broadcast_object_list([tmp])[0]  # one folder for all processes (same machine)
        test_resume_continues_exactly(os.path.join(shared, "resume"))
        test_total_limit_prunes(os.path.join(shared, "limit"))
        from cadence.runtime.state import PartialState

        PartialState().wait_for_everyone()
        if PartialState().is_main_process:
            print("All checkpointing checks passed.")


if __name__ == "__main__":
    main()
