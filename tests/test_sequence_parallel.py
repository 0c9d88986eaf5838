"""Sequence parallelism through DeepSpeed Ulysses (`ParallelismConfig(sp_size=2, sp_backend="deepspeed")`)
on 2 real gloo processes (DeepSpeed's CPU accelerator): each sample is split over the two ranks and
attention runs over all-to-alls, and the loss and every parameter's gradient equal one process
computing whole sequences (first principles: Ulysses' attention is exact attention, and the token-weighted
sum of the shards' losses is the whole sample's mean loss).

Refused: a batch without `position_ids`, a model with linear-attention layers, sp without DeepSpeed.
Runs when the `deepspeed` extra and transformers are installed."""

from __future__ import annotations

import importlib.util

import pytest
import torch
import torch.nn.functional as F
from cp_helpers import BATCH, LEARNING_RATE, VOCAB, make_llama

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("deepspeed") is None
    or importlib.util.find_spec("transformers") is None,
    reason="needs the deepspeed extra and transformers",
)

TOLERANCE = 1e-5  # fp32
LENGTH = 8  # a multiple of sp_size
STEPS = 2  # optimizer steps, each over BATCH whole samples
# Skip DeepSpeed's shared-memory all-reduce op (a minute of C++ compilation on a fresh machine).
ENV = {"CADENCE_DEEPSPEED_SHM_COMM": "0"}


def samples() -> list[dict[str, torch.Tensor]]:
    """STEPS x BATCH samples of LENGTH tokens; labels are the inputs (the model's convention)."""
    generator = torch.Generator().manual_seed(7)
    tokens = torch.randint(0, VOCAB, (STEPS * BATCH, LENGTH), generator=generator)
    return [
        {"input_ids": t.clone(), "labels": t.clone(), "position_ids": torch.arange(LENGTH)}
        for t in tokens
    ]


def reference_steps() -> list[dict]:
    """One process, no SP: per optimizer step the mean next-token loss of BATCH samples and the grads."""
    model = make_llama()
    optimizer = torch.optim.SGD(model.parameters(), lr=LEARNING_RATE)
    data = samples()
    records = []
    for step in range(STEPS):
        rows = data[step * BATCH : (step + 1) * BATCH]
        ids = torch.stack([r["input_ids"] for r in rows])
        logits = model(
            input_ids=ids, position_ids=torch.stack([r["position_ids"] for r in rows])
        ).logits
        loss = F.cross_entropy(logits[:, :-1].reshape(-1, VOCAB), ids[:, 1:].reshape(-1))
        loss.backward()
        grads = {n: p.grad.detach().clone() for n, p in model.named_parameters()}
        records.append({"loss": loss.item(), "grads": grads})
        optimizer.step()
        optimizer.zero_grad()
    return records


def _accelerator():
    from cadence import Accelerator
    from cadence.plugins import DeepSpeedPlugin, DeepSpeedSequenceParallelConfig, ParallelismConfig

    config = ParallelismConfig(
        sp_size=2,
        sp_backend="deepspeed",
        sp_handler=DeepSpeedSequenceParallelConfig(sp_attn_implementation="sdpa"),
    )
    # Stage 0: after the boundary backward each param.grad holds the reduced gradient to compare.
    plugin = DeepSpeedPlugin(zero_stage=0, gradient_clipping=0.0)
    return Accelerator(
        parallelism_config=config, deepspeed_plugin=plugin, gradient_accumulation_steps=BATCH
    )


def _restore_transformers_attention(saved) -> None:
    # Ulysses replaces transformers' global "sdpa" function and keeps its groups in module globals:
    # the worker processes are shared with other tests, so both are put back.
    from deepspeed.runtime.sequence_parallel import parallel_state_sp
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    ALL_ATTENTION_FUNCTIONS["sdpa"] = saved
    parallel_state_sp._release_sequence_parallel_groups()


def train_sp() -> dict:
    """Train STEPS optimizer steps with sp=2; per step the whole samples' mean loss and full grads."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    saved = ALL_ATTENTION_FUNCTIONS["sdpa"]
    try:
        acc = _accelerator()
        model = make_llama()
        optimizer = torch.optim.SGD(model.parameters(), lr=LEARNING_RATE)
        loader = torch.utils.data.DataLoader(samples(), batch_size=1)
        engine, optimizer, loader = acc.prepare(model, optimizer, loader)
        config = acc.deepspeed_plugin.deepspeed_config
        sp_group = engine.mpu.get_sequence_parallel_group()
        records, losses = [], []

        def weights():
            return {n: p.detach().clone() for n, p in engine.module.named_parameters()}

        before, micro_batches = weights(), 0
        for batch in loader:
            micro_batches += 1
            assert batch["input_ids"].shape == (1, LENGTH // 2)  # half of one sample
            with acc.accumulate(engine):
                logits = engine(
                    input_ids=batch["input_ids"], position_ids=batch["position_ids"]
                ).logits
                labels = batch["shift_labels"]
                local_sum = F.cross_entropy(
                    logits.reshape(-1, VOCAB),
                    labels.reshape(-1),
                    ignore_index=-100,
                    reduction="sum",
                )
                # This rank's share of the sample's mean loss: its tokens' sum over the whole
                # sample's token count. DeepSpeed sums the ranks' gradients over the sp group, so the
                # shares add up to the sample's gradient (a differentiable gather of the whole loss
                # on every rank would count it sp_size times).
                count = (labels != -100).sum()
                torch.distributed.all_reduce(count, group=sp_group)
                loss = local_sum / count
                acc.backward(loss)  # at the boundary the engine also steps (as in Accelerate)
                whole = loss.detach().clone()
                torch.distributed.all_reduce(whole, group=sp_group)
                losses.append(whole.item())
                optimizer.step()
                optimizer.zero_grad()
            if acc.sync_gradients:
                # SGD without momentum: the step's gradient is exactly (before - after) / lr.
                after = weights()
                grads = {n: (before[n] - after[n]) / LEARNING_RATE for n in after}
                records.append({"loss": sum(losses) / len(losses), "grads": grads})
                before, losses = after, []
        return {
            "records": records,
            "micro_batches": micro_batches,
            "train_batch_size": config["train_batch_size"],
        }
    finally:
        _restore_transformers_attention(saved)


def _run_in_fresh_workers(pool, function):
    """Run `function` on the pool's processes, then end them: DeepSpeed keeps the Ulysses mpu and
    its sequence groups process-wide, so a later DeepSpeed test in the same worker would find them
    (the pool starts fresh processes at its next use)."""
    pool.close()
    try:
        return pool.run(function, env=ENV, timeout=300)
    finally:
        pool.close()


def test_sp2_transformers_llama_matches_one_process(dist_pool):
    from cp_helpers import largest_differences

    got = _run_in_fresh_workers(dist_pool(2), train_sp)
    # Each rank read BATCH samples of its own; the adapter made them BATCH x sp micro-batches.
    assert got[0]["micro_batches"] == STEPS * BATCH
    assert got[0]["train_batch_size"] == BATCH  # micro 1 x accumulation BATCH x data-parallel 1
    loss, grad = largest_differences(got[0]["records"], reference_steps())
    print(f"sp=2 against one process: loss {loss:.2e}, gradient {grad:.2e}")
    assert loss < TOLERANCE and grad < TOLERANCE, (loss, grad)
    assert largest_differences(got[1]["records"], got[0]["records"]) == (0.0, 0.0)


def sp_refusals() -> dict[str, str]:
    """The errors of a linear-attention model and of batches without position_ids, on this rank."""
    from transformers import Qwen3NextConfig
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    saved = ALL_ATTENTION_FUNCTIONS["sdpa"]
    errors = {}
    try:
        acc = _accelerator()
        hybrid = torch.nn.Linear(2, 2)  # only its config is read before the refusal
        hybrid.config = Qwen3NextConfig(num_hidden_layers=4)
        try:
            acc.prepare(
                hybrid,
                torch.optim.SGD(hybrid.parameters(), lr=0.1),
                torch.utils.data.DataLoader(samples(), batch_size=1),
            )
        except ValueError as error:
            errors["linear attention"] = str(error)
        model = make_llama()
        rows = [{k: v for k, v in r.items() if k != "position_ids"} for r in samples()]
        loader = torch.utils.data.DataLoader(rows, batch_size=1)
        model, _, loader = acc.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1), loader)
        try:
            next(iter(loader))
        except ValueError as error:
            errors["no position_ids"] = str(error)
        return errors
    finally:
        _restore_transformers_attention(saved)


def test_sp_refuses_what_it_cannot_split(dist_pool):
    got = _run_in_fresh_workers(dist_pool(2), sp_refusals)
    for rank, errors in enumerate(got):
        assert "layers include linear_attention" in errors["linear attention"]
        assert "Set sp_size=1" in errors["linear attention"]
        message = errors["no position_ids"]
        assert message.startswith(f"[rank {rank}] Sequence parallelism (DeepSpeed Ulysses) needs")
        assert "['input_ids', 'labels']" in message
