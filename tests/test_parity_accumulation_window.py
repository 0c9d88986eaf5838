"""When Cadence reweights a dataloader's last, shorter accumulation window (docs/differences.md), on 2
real gloo processes: once per window, by the backward calls of the micro-step that closes it inside
`accumulate()`, and nowhere else.

- Several backward calls in the closing micro-step (two losses, a GAN's two models): every loss of the
  window counts the same; the gradients already accumulated are rescaled once, not once per backward.
- A backward outside `accumulate()` after a loop that ended on a short window is divided by
  `num_steps`, as in the reference: the window's reweighting does not leak into it.

Set-up: w * x with w a single weight, so d(loss)/dw = x. Samples 1..10, batch 1: rank 0 reads
1, 3, 5, 7, 9 and rank 1 reads 2, 4, 6, 8, 10; `num_steps=2` gives windows of two micro-steps and a
last window of one; DDP averages the two ranks.
"""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset


def prepared(adjust_last_window: bool = True):
    from cadence import Accelerator
    from cadence.utils import GradientAccumulationPlugin

    plugin = GradientAccumulationPlugin(num_steps=2, adjust_last_window=adjust_last_window)
    acc = Accelerator(cpu=True, gradient_accumulation_plugin=plugin)
    model = torch.nn.Linear(1, 1, bias=False)
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)  # a step's update is its gradient
    samples = torch.arange(1.0, 11.0).unsqueeze(1)
    loader = DataLoader(TensorDataset(samples), batch_size=1)
    return (acc, *acc.prepare(model, optimizer, loader))


def two_losses_per_micro_step(adjust_last_window: bool) -> list[float]:
    acc, model, optimizer, loader = prepared(adjust_last_window)
    weight = acc.unwrap_model(model).weight
    updates = []
    for (x,) in loader:
        with acc.accumulate(model):
            acc.backward(model(x).sum())  # d/dw = x
            acc.backward((2 * model(x)).sum())  # d/dw = 2x
            before = weight.item()
            optimizer.step()
            if acc.sync_gradients:
                updates.append(before - weight.item())
            optimizer.zero_grad()
    return updates


def test_several_backward_calls_in_the_closing_micro_step_count_once(dist_pool):
    # Each micro-step contributes 3x; a window's update is the mean over its micro-steps.
    full_windows = [3 * ((1 + 3) / 2 + (2 + 4) / 2) / 2, 3 * ((5 + 7) / 2 + (6 + 8) / 2) / 2]
    results = dist_pool(2).run(two_losses_per_micro_step, True)
    assert results == [pytest.approx([*full_windows, 3 * (9 + 10) / 2])] * 2
    # The switch gives the reference's numbers: every loss divided by num_steps, the last window too.
    results = dist_pool(2).run(two_losses_per_micro_step, False)
    assert results == [pytest.approx([*full_windows, 3 * (9 / 2 + 10 / 2) / 2])] * 2


def backward_after_the_loop() -> tuple[float, float]:
    acc, model, optimizer, loader = prepared()
    for (x,) in loader:
        with acc.accumulate(model):
            acc.backward(model(x).sum())
            optimizer.step()
            optimizer.zero_grad()
    last_window = acc.unwrap_model(model).weight.grad
    assert last_window is None or not last_window.any()  # zeroed after the last step
    # Outside accumulate(): the reference's rule, loss / num_steps (and DDP averages the ranks).
    sample = torch.tensor([[float(acc.process_index + 1)]])
    acc.backward(model(sample).sum())
    outside = acc.unwrap_model(model).weight.grad.item()
    optimizer.zero_grad()
    return outside, float(acc.sync_gradients)


def test_a_backward_outside_accumulate_is_not_reweighted(dist_pool):
    results = dist_pool(2).run(backward_after_the_loop)
    assert results == [((1 / 2 + 2 / 2) / 2, 1.0)] * 2


def gradients_and_updates(max_norm: float | None) -> list[tuple[float, float, float, float]]:
    acc, model, optimizer, loader = prepared()
    weight = acc.unwrap_model(model).weight
    seen = []
    for (x,) in loader:
        with acc.accumulate(model):
            acc.backward(model(x).sum())
            if not acc.sync_gradients:
                continue
            after_backward = weight.grad.item()
            norm = float("nan")
            if max_norm is not None:
                norm = float(acc.clip_grad_norm_(model.parameters(), max_norm))
            before = weight.item()
            optimizer.step()
            seen.append((after_backward, before - weight.item(), weight.grad.item(), norm))
            optimizer.zero_grad()
    return seen


def test_the_step_reweights_and_the_gradients_stay_the_reference_ones(dist_pool):
    """Between backward and step the gradients are the reference's (loss / num_steps, the last window
    too); the optimizer step uses the reweighted ones and puts the reference's back."""
    full_windows = [((1 + 3) / 2 + (2 + 4) / 2) / 2, ((5 + 7) / 2 + (6 + 8) / 2) / 2]
    last_reference, last_reweighted = (9 / 2 + 10 / 2) / 2, (9 + 10) / 2
    for seen in dist_pool(2).run(gradients_and_updates, None):
        grads, updates, after_step, _ = zip(*seen)
        assert list(grads) == pytest.approx([*full_windows, last_reference])
        assert list(updates) == pytest.approx([*full_windows, last_reweighted])
        assert after_step == grads
    # Clipping applies to the gradient the step uses: the norm returned is that one's, and with
    # max_norm 1 every update (all larger than 1) is exactly 1.
    for seen in dist_pool(2).run(gradients_and_updates, 1.0):
        _, updates, _, norms = zip(*seen)
        assert list(norms) == pytest.approx([*full_windows, last_reweighted])
        assert list(updates) == pytest.approx([1.0, 1.0, 1.0], rel=1e-5)
