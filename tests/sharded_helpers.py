"""Shared pieces of the sharded / model-parallel training tests (FSDP2, FSDP1, TP, DeepSpeed).

The expected weights come from first principles: data-parallel training averages the per-rank mean
gradients, so N ranks that each see 1/N of a global batch take the same step as one process that sees
the whole global batch. `reference_training` is that one process, in plain PyTorch.
"""

from __future__ import annotations

import pytest
import torch

from cadence.core import torch_compat

# FSDP2 on CPU/gloo with several processes is refused before torch_compat.FSDP2_ON_GLOO (torch's
# numbers are wrong there): those tests skip, and tests/test_torch_compat.py checks the refusal.
needs_fsdp2_on_cpu = pytest.mark.skipif(
    not torch_compat.torch_at_least(torch_compat.FSDP2_ON_GLOO),
    reason=f"FSDP2 on CPU/gloo is refused before torch {torch_compat.FSDP2_ON_GLOO} "
    "(tests/test_torch_compat.py checks the refusal)",
)

# fully_shard on CPU at all (one process included) is refused before torch_compat.FSDP2_ON_CPU.
needs_fsdp2_on_one_cpu = pytest.mark.skipif(
    not torch_compat.torch_at_least(torch_compat.FSDP2_ON_CPU),
    reason=f"FSDP2 on CPU is refused before torch {torch_compat.FSDP2_ON_CPU} "
    "(tests/test_torch_compat.py checks the refusal)",
)

FEATURES, HIDDEN, OUTPUTS = 6, 8, 2
DATASET_SIZE = 64
FP16_INIT_SCALE = 16.0


class Block(torch.nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.up = torch.nn.Linear(width, 2 * width)
        self.down = torch.nn.Linear(2 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(torch.tanh(self.up(x)))


class Net(torch.nn.Module):
    """Input layer, two residual blocks, output layer. `tp_plan` splits each block's two layers."""

    tp_plan = {"blocks.*.up": "colwise", "blocks.*.down": "rowwise"}

    def __init__(self) -> None:
        super().__init__()
        self.inp = torch.nn.Linear(FEATURES, HIDDEN)
        self.blocks = torch.nn.ModuleList([Block(HIDDEN), Block(HIDDEN)])
        self.out = torch.nn.Linear(HIDDEN, OUTPUTS)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.inp(x)
        for block in self.blocks:
            h = block(h)
        return self.out(h)


def make_model(seed: int = 0) -> Net:
    torch.manual_seed(seed)
    return Net()


def make_dataset() -> torch.utils.data.TensorDataset:
    generator = torch.Generator().manual_seed(1234)
    x = torch.randn(DATASET_SIZE, FEATURES, generator=generator)
    w = torch.randn(FEATURES, OUTPUTS, generator=generator)
    y = torch.tanh(x @ w) + 0.05 * torch.randn(DATASET_SIZE, OUTPUTS, generator=generator)
    return torch.utils.data.TensorDataset(x, y)


def make_optimizer(model: torch.nn.Module, kind: str = "adamw") -> torch.optim.Optimizer:
    """AdamW by default. Mixed precision tests use SGD: Adam turns a rounding-sized gradient into a full
    step of either sign, so bf16 runs could only be compared with a tolerance as large as an update."""
    if kind == "sgd":
        return torch.optim.SGD(model.parameters(), lr=0.2, momentum=0.9)
    return torch.optim.AdamW(model.parameters(), lr=0.02, weight_decay=0.01)


def loss_fn(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.mse_loss(output.float(), target)


def reference_training(
    global_batch: int,
    micro_batches: int,
    accumulation: int = 1,
    mixed_precision: str = "no",
    clip: float | None = None,
    start: int = 0,
    optimizer: str = "adamw",
) -> dict[str, torch.Tensor]:
    """One process, plain PyTorch: `micro_batches` micro-batches of `global_batch` samples each.

    mixed_precision "bf16" runs the forward under autocast (Accelerate's and FSDP's bf16); "bf16-weights"
    runs forward and backward on a bf16 copy of fp32 master weights (DeepSpeed's bf16).
    """
    model = make_model()
    optimizer = make_optimizer(model, optimizer)
    # fp16: autocast with a loss scaler (small initial scale, so no step is skipped in these tests).
    scaler = torch.amp.GradScaler(
        "cpu", init_scale=FP16_INIT_SCALE, enabled=mixed_precision == "fp16"
    )
    dtype = torch.float16 if mixed_precision == "fp16" else torch.bfloat16
    x, y = make_dataset().tensors
    for step in range(start, start + micro_batches):
        xb = x[step * global_batch : (step + 1) * global_batch]
        yb = y[step * global_batch : (step + 1) * global_batch]
        if mixed_precision == "bf16-weights":
            _bf16_weights_backward(model, xb, yb, accumulation)
        else:
            with torch.autocast("cpu", dtype=dtype, enabled=mixed_precision in ("bf16", "fp16")):
                out = model(xb)
            scaler.scale(loss_fn(out, yb) / accumulation).backward()
        if (step + 1) % accumulation == 0:
            if clip is not None:
                scaler.unscale_(optimizer)
                torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
            scaler.step(optimizer)
            scaler.update()
            optimizer.zero_grad()
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def make_loader(global_batch: int, dp_size: int) -> torch.utils.data.DataLoader:
    """The dataset in order, `global_batch / dp_size` samples per rank and step."""
    return torch.utils.data.DataLoader(make_dataset(), batch_size=global_batch // dp_size)


def _bf16_weights_backward(master: torch.nn.Module, xb, yb, accumulation: int) -> None:
    import copy

    low = copy.deepcopy(master).to(torch.bfloat16)
    (loss_fn(low(xb.to(torch.bfloat16)), yb) / accumulation).backward()
    for p, q in zip(master.parameters(), low.parameters()):
        grad = q.grad.float()
        p.grad = grad if p.grad is None else p.grad + grad


def train_with(
    accelerator,
    model,
    optimizer,
    global_batch: int,
    micro_batches: int,
    dp_size: int | None = None,
    clip: float | None = None,
    loader=None,
    input_dtype: torch.dtype | None = None,
):
    """Train through the Accelerator on a prepared dataloader (made here unless one is given)."""
    if loader is None:
        loader = accelerator.prepare(
            make_loader(global_batch, dp_size or accelerator.num_processes)
        )
    for step, (xb, yb) in enumerate(loader):
        if step == micro_batches:
            break
        if input_dtype is not None:
            xb = xb.to(input_dtype)
        with accelerator.accumulate(model):
            loss = loss_fn(model(xb), yb)
            accelerator.backward(loss)
            if clip is not None and accelerator.sync_gradients:
                accelerator.clip_grad_norm_(model.parameters(), clip)
            optimizer.step()
            optimizer.zero_grad()
    return model


def max_difference(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert sorted(a) == sorted(b), (sorted(a), sorted(b))
    return max((a[k].float() - b[k].float()).abs().max().item() for k in a)


def train_by_index(
    accelerator,
    model,
    optimizer,
    global_batch: int,
    start: int,
    count: int,
    dp_rank: int,
    dp_size: int,
):
    """Train steps `start .. start+count-1` on this rank's slice of each global batch (no dataloader)."""
    x, y = make_dataset().tensors
    local = global_batch // dp_size
    for step in range(start, start + count):
        begin = step * global_batch + dp_rank * local
        loss = loss_fn(model(x[begin : begin + local]), y[begin : begin + local])
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()


def save_state_round_trip(
    accelerator, directory: str, phase: str, global_batch: int, dp_rank: int, dp_size: int
):
    """phase "save": 2 steps, save_state, 2 more steps. phase "load": a model initialised differently,
    load_state, the same 2 steps. Both return the gathered weights, which must be equal."""
    model = make_model(seed=0 if phase == "save" else 42)
    optimizer = make_optimizer(model)
    loader = make_loader(global_batch, dp_size)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    if phase == "save":
        train_by_index(accelerator, model, optimizer, global_batch, 0, 2, dp_rank, dp_size)
        accelerator.save_state(directory)
    else:
        accelerator.load_state(directory)
    train_by_index(accelerator, model, optimizer, global_batch, 2, 2, dp_rank, dp_size)
    return accelerator.get_state_dict(model)
