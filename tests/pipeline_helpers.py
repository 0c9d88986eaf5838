"""Pieces of the pipeline-parallel tests: the models (a chain that is not a Sequential, a Sequential,
a tiny transformers Llama), the fixed data, the one-process reference in plain PyTorch, and the
training through the Accelerator under pp that the tests compare with it.

The expected values come from first principles: every process of a pipeline reads the same batch,
the stages together compute the model's forward and backward, and the mean of equal micro-batches'
mean losses is the batch's mean loss, so the loss, the gradients and the weights after N steps equal
one process training the same global batches.
"""

from __future__ import annotations

import pytest
import torch
from sharded_helpers import Block  # the residual block of the sharded tests

GLOBAL_BATCH = 16
FEATURES, WIDTH, OUTPUTS = 6, 8, 2
MAX_STEPS = 8


class Net(torch.nn.Module):
    """Not a Sequential: its forward is its children in order, the list expanded (8 units).
    `tp_plan` splits each block's two layers (pp x tp)."""

    tp_plan = {"blocks.*.up": "colwise", "blocks.*.down": "rowwise"}

    def __init__(self) -> None:
        super().__init__()
        self.inp = torch.nn.Linear(FEATURES, WIDTH)
        self.blocks = torch.nn.ModuleList([Block(WIDTH) for _ in range(6)])
        self.out = torch.nn.Linear(WIDTH, OUTPUTS)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.inp(x)
        for block in self.blocks:
            h = block(h)
        return self.out(h)


def make_model(kind: str = "net") -> torch.nn.Module:
    torch.manual_seed(0)
    if kind == "sequential":
        return torch.nn.Sequential(
            torch.nn.Linear(FEATURES, WIDTH),
            *[Block(WIDTH) for _ in range(6)],
            torch.nn.Linear(WIDTH, OUTPUTS),
        )
    return Net()


def make_data(steps: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The first `steps` global batches of one fixed dataset."""
    generator = torch.Generator().manual_seed(1234)
    x = torch.randn(MAX_STEPS * GLOBAL_BATCH, FEATURES, generator=generator)
    y = torch.tanh(x @ torch.randn(FEATURES, OUTPUTS, generator=generator))
    return x[: steps * GLOBAL_BATCH], y[: steps * GLOBAL_BATCH]


def loss_fn(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.mse_loss(output, target)


def make_optimizer(model: torch.nn.Module, sgd: bool = False) -> torch.optim.Optimizer:
    """AdamW; SGD for bf16 (Adam turns a rounding-sized gradient into a whole step of either sign)."""
    if sgd:
        return torch.optim.SGD(model.parameters(), lr=0.2, momentum=0.9)
    return torch.optim.AdamW(model.parameters(), lr=0.02, weight_decay=0.01)


def make_scheduler(optimizer: torch.optim.Optimizer) -> torch.optim.lr_scheduler.LRScheduler:
    """The learning rate falls by a quarter at every optimizer step."""
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 0.75**step)


def reference(
    steps: int,
    kind: str = "net",
    accumulation: int = 1,
    clip: float | None = None,
    mixed_precision: str = "no",
    dp: int = 1,
):
    """One process, plain PyTorch, on the whole global batches: (losses, weights, the first batch's
    loss evaluated after training). The scheduler advances `dp` steps per optimizer step, as a
    prepared one does over `dp` data-parallel replicas (Accelerate's rule: each replica's batch is
    the batch the schedule was written for)."""
    model = make_model(kind)
    optimizer = make_optimizer(model, sgd=mixed_precision == "bf16")
    scheduler = make_scheduler(optimizer)
    x, y = make_data(steps)
    losses = []
    for step in range(steps):
        batch = slice(step * GLOBAL_BATCH, (step + 1) * GLOBAL_BATCH)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=mixed_precision == "bf16"):
            output = model(x[batch])
        loss = loss_fn(output.float(), y[batch])
        losses.append(loss.item())
        # a shorter last window is averaged over its own micro-batches (Cadence's reweighting)
        window = min(accumulation, steps - step // accumulation * accumulation)
        (loss / window).backward()
        if (step + 1) % accumulation == 0 or step + 1 == steps:
            if clip is not None:
                torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
            optimizer.step()
            for _ in range(dp):
                scheduler.step()
            optimizer.zero_grad()
    with torch.no_grad(), torch.autocast("cpu", torch.bfloat16, enabled=mixed_precision == "bf16"):
        evaluated = loss_fn(model(x[:GLOBAL_BATCH]).float(), y[:GLOBAL_BATCH]).item()
    return losses, {k: v.detach().clone() for k, v in model.state_dict().items()}, evaluated


def train_pp(
    steps: int,
    pp_size: int = 2,
    schedule: str = "1F1B",
    kind: str = "net",
    dp_replicate_size: int = 1,
    dp_shard_size: int = 1,
    tp_size: int = 1,
    accumulation: int = 1,
    clip: float | None = None,
    n_microbatches: int | None = None,
    split_points=None,
    mixed_precision: str = "no",
):
    """Train through the Accelerator under pp; returns (losses seen on this rank, whole state dict on
    rank 0, this rank's parameter count, (its DTensor parameters, its parameters), its first batch's
    loss evaluated under no_grad after training)."""
    from cadence import Accelerator
    from cadence.plugins import ParallelismConfig, PipelineParallelConfig

    handler = PipelineParallelConfig(
        schedule=schedule, n_microbatches=n_microbatches, split_points=split_points, loss_fn=loss_fn
    )
    config = ParallelismConfig(
        pp_size=pp_size,
        dp_replicate_size=dp_replicate_size,
        dp_shard_size=dp_shard_size,
        tp_size=tp_size,
        pp_handler=handler,
    )
    from cadence.plugins import FullyShardedDataParallelPlugin

    acc = Accelerator(
        parallelism_config=config,
        gradient_accumulation_steps=accumulation,
        mixed_precision=mixed_precision,
        # with dp_shard, as a script for FSDP2 would say it: each stage is sharded with FSDP2
        fsdp_plugin=FullyShardedDataParallelPlugin(fsdp_version=2) if dp_shard_size > 1 else None,
    )
    model = make_model(kind)
    optimizer = make_optimizer(model, sgd=mixed_precision == "bf16")
    dp = dp_replicate_size * dp_shard_size
    x, y = make_data(steps)
    loader = torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(x, y), batch_size=GLOBAL_BATCH // dp
    )
    scheduler = make_scheduler(optimizer)
    model, optimizer, loader, scheduler = acc.prepare(model, optimizer, loader, scheduler)
    losses, first = [], None
    for xb, yb in loader:
        first = first or (xb, yb)
        with acc.accumulate(model):
            loss = model(xb, labels=yb)
            acc.backward(loss)
            losses.append(loss.item())
            if clip is not None and acc.sync_gradients:
                acc.clip_grad_norm_(model.parameters(), clip)
            optimizer.step()
            scheduler.step()  # advances once per optimizer step and data-parallel replica
            optimizer.zero_grad()
    try:
        with torch.no_grad():  # the schedule's forward only
            evaluated = model(first[0], labels=first[1]).item()
    except ValueError as error:  # ZBVZeroBubble: refused
        evaluated = str(error)
    from torch.distributed.tensor import DTensor

    local = sum(p.numel() for p in model.parameters())
    params = list(model.parameters())
    sharded = (sum(isinstance(p, DTensor) for p in params), len(params))
    return losses, acc.get_state_dict(model), local, sharded, evaluated


def check_against_reference(results, steps, dp=1, tolerance=1e-5, **options):
    losses, weights, evaluated = reference(steps, dp=dp, **options)
    for rank_losses, _, _, _, rank_evaluated in results:
        # with dp replicas, each rank's loss is its replica's share of the batch (checked apart)
        if dp == 1:
            assert rank_losses == pytest.approx(losses, abs=tolerance), (rank_losses, losses)
            if isinstance(rank_evaluated, str):
                assert "ZBVZeroBubble" in rank_evaluated, rank_evaluated
            else:
                assert rank_evaluated == pytest.approx(evaluated, abs=tolerance)
    state = results[0][1]
    assert sorted(state) == sorted(weights)
    worst = max((state[k] - weights[k]).abs().max().item() for k in weights)
    assert worst < tolerance, worst


def prepare_pipeline(pp_size, schedule="1F1B", dp_shard_size=1, kind="net"):
    """An Accelerator under pp and its prepared (model, AdamW, scheduler), for hand-written steps."""
    from cadence import Accelerator
    from cadence.plugins import ParallelismConfig, PipelineParallelConfig

    config = ParallelismConfig(
        pp_size=pp_size,
        dp_shard_size=dp_shard_size,
        pp_handler=PipelineParallelConfig(schedule=schedule, loss_fn=loss_fn),
    )
    acc = Accelerator(parallelism_config=config)
    model = make_model(kind)
    optimizer = make_optimizer(model)
    return acc, acc.prepare(model, optimizer, make_scheduler(optimizer))


def train_steps(acc, objects, first, count):
    """Global batches `first .. first + count - 1`, one optimizer step each (every rank the whole
    batch: no data parallelism here)."""
    model, optimizer, scheduler = objects
    x, y = make_data(first + count)
    for step in range(first, first + count):
        batch = slice(step * GLOBAL_BATCH, (step + 1) * GLOBAL_BATCH)
        acc.backward(model(x[batch], labels=y[batch]))
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()


def make_llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=64,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=4,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=32,
        tie_word_embeddings=False,
    )
    return LlamaForCausalLM(config)


def llama_batches(steps: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(7)
    return torch.randint(0, 64, (steps, GLOBAL_BATCH // 2, 8), generator=generator)
