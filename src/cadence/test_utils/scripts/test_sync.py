"""Gradient synchronisation across the launched processes: `no_sync` keeps gradients local,
a normal backward averages them, `accumulate` syncs and steps only at the end of each window,
and a prepared scheduler steps only with the optimizer."""

from __future__ import annotations

from contextlib import nullcontext

import torch

from cadence import Accelerator
from cadence.runtime.state import AcceleratorState, GradientState
from cadence.test_utils.scripts._checks import check
from cadence.utils import gather


def _weight_grad(model: torch.nn.Module) -> torch.Tensor:
    return model.weight.grad.detach().reshape(1).clone()


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Linear(1, 1, bias=False)


def test_noop_sync(accelerator: Accelerator) -> None:
    """On one process, no_sync changes nothing: the gradient is the local gradient."""
    if accelerator.num_processes != 1:
        return
    model = accelerator.prepare(_model())
    with accelerator.no_sync(model):
        accelerator.backward(model(torch.tensor([[3.0]], device=accelerator.device)).sum())
    check(_weight_grad(model).item() == 3.0, "no_sync on one process keeps the plain gradient")


def test_distributed_sync(accelerator: Accelerator) -> None:
    """Under no_sync each process keeps its own gradient; outside it the gradients are averaged."""
    n, rank = accelerator.num_processes, accelerator.process_index
    if n == 1:
        return
    model = accelerator.prepare(_model())
    inner = accelerator.unwrap_model(model)
    x = torch.tensor(
        [[rank + 1.0]], device=accelerator.device
    )  # d(sum(w*x))/dw = x: differs per rank
    for iteration in range(4):
        local_only = iteration % 2 == 0
        with accelerator.no_sync(model) if local_only else nullcontext():
            accelerator.backward(model(x).sum())
        grads = gather(_weight_grad(inner).to(accelerator.device)).tolist()
        if local_only:
            check(
                grads == [float(r + 1) for r in range(n)],
                f"iteration {iteration}: no_sync grads {grads}",
            )
        else:
            mean = (n + 1) / 2
            check(
                all(abs(g - mean) < 1e-6 for g in grads),
                f"iteration {iteration}: synced grads {grads}",
            )
        inner.weight.grad = None


def test_gradient_accumulation(steps: int = 2) -> None:
    """Inside accumulate(), gradients sync and the optimizer steps only at each window's end."""
    accelerator = Accelerator(gradient_accumulation_steps=steps, cpu=True)
    n = accelerator.num_processes
    dataset = torch.utils.data.TensorDataset(torch.arange(1.0, 1.0 + 4 * steps * n).reshape(-1, 1))
    loader = torch.utils.data.DataLoader(dataset, batch_size=1)
    model = _model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    inner = accelerator.unwrap_model(model)
    for index, (x,) in enumerate(loader):
        before = inner.weight.detach().clone()
        with accelerator.accumulate(model):
            accelerator.backward(model(x).sum())
            at_window_end = (index + 1) % steps == 0
            check(
                accelerator.sync_gradients == at_window_end,
                f"batch {index}: sync_gradients={accelerator.sync_gradients}, expected {at_window_end}",
            )
            grads = gather(_weight_grad(inner)).tolist()
            if at_window_end:
                check(
                    all(abs(g - grads[0]) < 1e-6 for g in grads),
                    f"batch {index}: window-end grads {grads}",
                )
            optimizer.step()
            optimizer.zero_grad()
        changed = not torch.equal(before, inner.weight.detach())
        check(
            changed == at_window_end,
            f"batch {index}: weights changed={changed}, expected {at_window_end}",
        )
    AcceleratorState._reset_state(True)
    GradientState._reset_state()


def test_scheduler_follows_optimizer(steps: int = 2) -> None:
    """A prepared scheduler steps only when the optimizer really stepped (once per window)."""
    accelerator = Accelerator(gradient_accumulation_steps=steps, cpu=True)
    n = accelerator.num_processes
    loader = torch.utils.data.DataLoader(torch.arange(4.0 * steps * n).reshape(-1, 1), batch_size=1)
    model = _model()
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
    model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader, scheduler)
    windows = 0
    for x in loader:
        with accelerator.accumulate(model):
            accelerator.backward(model(x).sum())
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
            windows += int(accelerator.sync_gradients)
    # The reference scales the schedule by the number of processes (each step stands for n batches).
    expected = 0.5 ** (windows * n)
    lr = scheduler.get_last_lr()[0]
    check(abs(lr - expected) < 1e-9, f"after {windows} windows the lr is {lr}, expected {expected}")
    AcceleratorState._reset_state(True)
    GradientState._reset_state()


def test_dataloader_break(accelerator: Accelerator) -> None:
    """Leaving a prepared dataloader early does not leave the gradient state at end of data."""
    loader = accelerator.prepare(torch.utils.data.DataLoader(torch.arange(16.0), batch_size=2))
    for index, _ in enumerate(loader):
        if index == 1:
            break
    check(
        not accelerator.gradient_state.end_of_dataloader,
        "breaking out early marked the end of the data",
    )
    batches = sum(1 for _ in loader)
    check(
        batches == len(loader), f"a second pass yielded {batches} batches, expected {len(loader)}"
    )


def main() -> None:
    """Run every check of this script on this process; the first failure raises."""
    accelerator = Accelerator(cpu=True)
    accelerator.print("testing no_sync on one process")
    test_noop_sync(accelerator)
    accelerator.print("testing no_sync / sync across processes")
    test_distributed_sync(accelerator)
    accelerator.print("testing breaking out of a dataloader")
    test_dataloader_break(accelerator)
    AcceleratorState._reset_state(True)
    GradientState._reset_state()
    for steps in (1, 2, 3):
        if _is_main():
            print(f"testing gradient accumulation over {steps} step(s)")
        test_gradient_accumulation(steps)
    test_scheduler_follows_optimizer()
    if _is_main():
        print("All synchronisation checks passed.")


def _is_main() -> bool:
    from cadence.runtime.state import PartialState

    return PartialState().is_main_process


def _mp_fn(index: int) -> None:
    """Entry point for spawn-based launchers (one call per process)."""
    main()


if __name__ == "__main__":
    main()
