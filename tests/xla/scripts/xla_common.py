"""Shared pieces of the XLA scenario scripts: the model, the data, eager CPU training (plain torch, the
expected values), and the JSON report printed as the last line."""

from __future__ import annotations

import json
import sys

import torch

STEPS = 8
BATCH = 8
ACCUMULATION = 2
CLIP = 0.5
LR = 0.05


class TiedNet(torch.nn.Module):
    """A small regression net whose output layer shares its weight with the input layer."""

    def __init__(self) -> None:
        super().__init__()
        self.encode = torch.nn.Linear(4, 4)
        self.decode = torch.nn.Linear(4, 4)
        self.decode.weight = self.encode.weight  # tied: the XLA move must keep them one tensor

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.decode(torch.tanh(self.encode(x)))


def dataset() -> torch.utils.data.TensorDataset:
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(STEPS * BATCH * ACCUMULATION, 4, generator=generator)
    y = x @ torch.tensor([[0.5, -1.0, 0.2, 0.0]] * 4).T + 0.1
    return torch.utils.data.TensorDataset(x, y)


def fresh_model() -> TiedNet:
    torch.manual_seed(1)
    return TiedNet()


def eager_cpu_training(
    batch_size: int = BATCH, accumulation: int = ACCUMULATION, autocast_bf16: bool = False
) -> tuple[dict[str, torch.Tensor], list[float]]:
    """The same training in plain eager torch on the CPU: the expected weights and per-step losses."""
    model = fresh_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)
    loader = torch.utils.data.DataLoader(dataset(), batch_size=batch_size, shuffle=False)
    losses = []
    for index, (x, y) in enumerate(loader):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast_bf16):
            out = model(x)
        loss = torch.nn.functional.mse_loss(out.float(), y)
        losses.append(loss.item())
        (loss / accumulation).backward()
        if (index + 1) % accumulation == 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
            optimizer.step()
            optimizer.zero_grad()
    return {k: v.detach().clone() for k, v in model.state_dict().items()}, losses


def train_plainly(accelerator) -> list[float]:
    """One epoch of plain SGD through a prepared model, optimizer and loader; the per-step losses."""
    model = fresh_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    loader = torch.utils.data.DataLoader(dataset(), batch_size=BATCH)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    losses = []
    for x, y in loader:
        loss = torch.nn.functional.mse_loss(model(x), y)
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss)  # still lazy: read after the loop, as a script would
    return [float(loss.item()) for loss in losses]


def max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys(), (sorted(a), sorted(b))
    return max(float((a[k].float().cpu() - b[k].float().cpu()).abs().max()) for k in a)


def report(results: dict) -> None:
    print("XLA-RESULT " + json.dumps(results), flush=True)
    sys.stdout.flush()
