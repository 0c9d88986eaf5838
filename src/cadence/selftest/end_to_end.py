"""Checks that this set-up trains correctly: collectives, a few training steps, a checkpoint round-trip.

Launched by `cadence test` on the configured processes; exits non-zero with a message on the first failure.
"""

from __future__ import annotations

import sys
import tempfile

import torch

from cadence import Accelerator
from cadence.utils import broadcast_object_list, gather_object


def check(condition: bool, what: str) -> None:
    """Exit with a failure message naming `what` unless `condition` holds."""
    if not condition:
        raise SystemExit(f"cadence test FAILED: {what}")


def check_collectives(accelerator) -> None:
    """Check that gather and reduce across the processes give the expected values."""
    n, rank = accelerator.num_processes, accelerator.process_index
    gathered = accelerator.gather(torch.tensor([rank], device=accelerator.device))
    check(gathered.tolist() == list(range(n)), f"gather of ranks gave {gathered.tolist()}")
    total = accelerator.reduce(
        torch.tensor([rank + 1.0], device=accelerator.device), reduction="sum"
    )
    check(total.item() == n * (n + 1) / 2, f"reduce(sum) gave {total.item()}")

    check(gather_object([rank]) == list(range(n)), "gather_object of ranks")
    message = ["from the main process"] if accelerator.is_main_process else [None]
    check(broadcast_object_list(message) == ["from the main process"], "broadcast_object_list")
    accelerator.wait_for_everyone()
    accelerator.print(f"  collectives ok on {n} process(es) ({accelerator.distributed_type.value})")


def make_loader(batch_size: int):
    """A shuffled DataLoader over a small seeded linear-regression dataset."""
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(64, 4, generator=generator)
    y = x @ torch.tensor([[2.0], [-1.0], [0.5], [1.0]])
    return torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(x, y), batch_size=batch_size, shuffle=True
    )


def train_steps(accelerator, model, optimizer, loader, steps: int) -> float:
    """Train for `steps` batches of `loader` and return the last loss."""
    loss = torch.tensor(0.0)
    for step, (x, y) in enumerate(loader):
        if step == steps:
            break
        loss = torch.nn.functional.mse_loss(model(x), y)
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
    return loss.item()


def check_training_and_checkpoint(accelerator) -> None:
    """Train a little, check a save_state/load_state round trip and that ranks agree."""
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    model, optimizer, loader = accelerator.prepare(model, optimizer, make_loader(8))
    first = train_steps(accelerator, model, optimizer, loader, 2)
    directory = tempfile.mkdtemp(prefix="cadence-test-") if accelerator.is_main_process else None

    directory = broadcast_object_list([directory])[0]
    accelerator.save_state(directory)
    saved = accelerator.unwrap_model(model).weight.detach().clone()
    continued = train_steps(accelerator, model, optimizer, loader, 2)
    accelerator.load_state(directory)
    restored = accelerator.unwrap_model(model).weight.detach()
    check(torch.equal(saved, restored), "load_state did not restore the saved weights")
    weights = accelerator.gather(restored.reshape(1, -1))
    check(bool((weights == weights[0]).all()), "ranks hold different weights after training")
    accelerator.print(
        f"  training ok (loss {first:.4f} -> {continued:.4f}); checkpoint round-trip ok"
    )


def main() -> None:
    """Run the Cadence self-test on every process."""
    accelerator = Accelerator()
    accelerator.print(
        f"Running the Cadence self-test on {accelerator.num_processes} process(es)..."
    )
    check_collectives(accelerator)
    check_training_and_checkpoint(accelerator)
    accelerator.wait_for_everyone()
    accelerator.print("All checks passed.")


if __name__ == "__main__":
    sys.exit(main())
