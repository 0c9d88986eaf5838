"""gather_for_metrics returns exactly one prediction per evaluation sample, whatever the number of
processes, batch size, `split_batches` or `dispatch_batches`: metrics match one-process evaluation."""

from __future__ import annotations

import torch
from torch.utils.data import DataLoader

from cadence import Accelerator
from cadence.runtime.state import AcceleratorState, GradientState, PartialState
from cadence.test_utils.scripts._checks import check
from cadence.test_utils.training import RegressionDataset, RegressionModel
from cadence.utils import DataLoaderConfiguration


def baseline(length: int, batch_size: int) -> torch.Tensor:
    """Predictions of a one-process evaluation, in dataset order."""
    model = RegressionModel(a=1.5, b=-0.5)
    model.first_batch = False
    loader = DataLoader(RegressionDataset(length=length, seed=7), batch_size=batch_size)
    with torch.no_grad():
        return torch.cat([model(batch["x"]) for batch in loader])


def distributed(
    length: int, batch_size: int, split_batches: bool, dispatch_batches: bool
) -> torch.Tensor:
    """Predictions gathered with gather_for_metrics from a prepared evaluation."""
    AcceleratorState._reset_state(True)
    GradientState._reset_state()
    config = DataLoaderConfiguration(split_batches=split_batches, dispatch_batches=dispatch_batches)
    accelerator = Accelerator(cpu=True, dataloader_config=config)
    model = RegressionModel(a=1.5, b=-0.5)
    model.first_batch = False
    loader = DataLoader(RegressionDataset(length=length, seed=7), batch_size=batch_size)
    model, loader = accelerator.prepare(model, loader)
    outputs = []
    with torch.no_grad():
        for batch in loader:
            outputs.append(accelerator.gather_for_metrics(model(batch["x"])))
    return torch.cat(outputs).cpu()


def main() -> None:
    """Run every check of this script on this process; the first failure raises."""
    n = PartialState().num_processes
    for length in (64, 82, 8 * n + 3):
        for split_batches in (False, True):
            for dispatch_batches in (False, True):
                batch_size = 8 if split_batches and 8 % n == 0 else 4
                if split_batches and batch_size % n:
                    continue
                got = distributed(length, batch_size, split_batches, dispatch_batches)
                want = baseline(length, batch_size)
                what = f"length={length} split_batches={split_batches} dispatch_batches={dispatch_batches}"
                check(
                    got.shape == want.shape,
                    f"{what}: {tuple(got.shape)} predictions, expected {tuple(want.shape)}",
                )
                check(
                    torch.allclose(got.sort().values, want.sort().values),
                    f"{what}: predictions differ",
                )
    if PartialState().is_main_process:
        print("All gather_for_metrics checks passed.")


if __name__ == "__main__":
    main()
