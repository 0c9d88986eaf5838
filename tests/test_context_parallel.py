"""Context parallelism (`ParallelismConfig(cp_size=N)`) on real gloo processes: inside
`maybe_context_parallel` each rank holds 1/N of the sequence, and the loss and every parameter's
gradient equal one process computing the whole sequence (first principles: ring attention is exact
attention, and the ranks' mean losses over equal token counts average to the whole mean).

Walked: cp = 2 and 4; FSDP2 (sharded over dp_shard_cp) and plain DDP (ACCELERATE_ALLOW_CP_STANDALONE);
both rotate methods; sequence lengths divisible by 2*cp (load-balanced) and by cp only; a tiny causal
model and a tiny transformers Llama (sdpa). Refused: cp without FSDP2, a mask that is not causal,
position_ids not passed as a buffer, sliding-window models, lengths not divisible by cp. Off: the
context manager warns once and does nothing."""

from __future__ import annotations

import importlib.util
import logging

import pytest
import torch
from cp_helpers import (
    LEARNING_RATE,
    batch,
    largest_differences,
    logits_of,
    loss_of,
    make_llama,
    make_tiny,
    reference_steps,
    step_tokens,
)

from harness import WorkerError

TOLERANCE = 1e-5  # fp32; observed differences are around 1e-7
STANDALONE = {"ACCELERATE_ALLOW_CP_STANDALONE": "true"}


def _accelerator(rotate: str, fsdp: bool, cp_size: int | None = None):
    import os

    from cadence import Accelerator
    from cadence.plugins import (
        FullyShardedDataParallelPlugin,
        ParallelismConfig,
        TorchContextParallelConfig,
    )

    config = ParallelismConfig(
        cp_size=cp_size or int(os.environ["WORLD_SIZE"]),
        cp_handler=TorchContextParallelConfig(cp_comm_strategy=rotate),
    )
    plugin = FullyShardedDataParallelPlugin(fsdp_version=2) if fsdp else None
    return Accelerator(parallelism_config=config, fsdp_plugin=plugin)


def train_cp(kind: str, lengths: list[int], rotate: str, fsdp: bool) -> list[dict]:
    """Train with context parallelism over every process; per step the mean loss and full gradients."""
    from torch.distributed.tensor import DTensor

    acc = _accelerator(rotate, fsdp)
    model = make_tiny() if kind == "tiny" else make_llama()
    optimizer = torch.optim.SGD(model.parameters(), lr=LEARNING_RATE)
    model, optimizer = acc.prepare(model, optimizer)
    if fsdp:  # sharded over dp_shard_cp: each rank holds 1/cp of every parameter
        assert all(isinstance(p, DTensor) for p in model.parameters())
        assert model.parameters().__next__().device_mesh.mesh_dim_names == ("dp_shard_cp",)
    records = []
    for step, length in enumerate(lengths):
        inputs = batch(step, length)
        buffers = [inputs["input_ids"], inputs["labels"], inputs["position_ids"]]
        with acc.maybe_context_parallel(
            buffers=buffers, buffer_seq_dims=[1, 1, 1], no_restore_buffers={buffers[0]}
        ):
            # The sequence really is split: this rank sees length / cp tokens.
            assert inputs["input_ids"].shape == (2, length // acc.num_processes)
            loss = loss_of(logits_of(model, inputs), inputs["labels"])
            acc.backward(loss)
        # Restored on exit, except the buffer named in no_restore_buffers.
        assert inputs["labels"].shape[1] == length
        assert inputs["input_ids"].shape[1] == length // acc.num_processes
        grads = {}
        for name, param in acc.unwrap_model(model).named_parameters():
            grad = param.grad
            grads[name] = (grad.full_tensor() if isinstance(grad, DTensor) else grad).clone()
        records.append({"loss": acc.reduce(loss.detach(), "mean").item(), "grads": grads})
        optimizer.step()
        optimizer.zero_grad()
    if kind == "llama":  # labels the model would shift inside each shard: refused
        inputs = batch(0, 8)
        buffers = [inputs["input_ids"], inputs["position_ids"]]
        try:
            with acc.maybe_context_parallel(buffers=buffers, buffer_seq_dims=[1, 1]):
                model(**inputs)
        except ValueError as error:
            records[-1]["labels refused"] = str(error)
    return records


# (lengths per step: divisible by 2*cp, then by cp only, for cp=2 / cp=4)
LENGTHS = {2: [8, 6, 8], 4: [16, 12]}


@pytest.mark.parametrize("fsdp", [True, False], ids=["fsdp2", "ddp"])
@pytest.mark.parametrize("rotate", ["allgather", "alltoall"])
def test_cp2_matches_one_process(dist_pool, rotate, fsdp):
    got = dist_pool(2).run(
        train_cp, "tiny", LENGTHS[2], rotate, fsdp, env=None if fsdp else STANDALONE
    )
    loss, grad = largest_differences(got[0], reference_steps("tiny", LENGTHS[2]))
    assert loss < TOLERANCE and grad < TOLERANCE, (loss, grad)
    assert largest_differences(got[1], got[0]) == (0.0, 0.0)  # every rank sees the same numbers


@pytest.mark.parametrize(
    "rotate,fsdp",
    [("allgather", True), ("alltoall", False)],
    ids=["allgather-fsdp2", "alltoall-ddp"],
)
def test_cp4_matches_one_process(dist_pool, rotate, fsdp):
    got = dist_pool(4).run(
        train_cp, "tiny", LENGTHS[4], rotate, fsdp, env=None if fsdp else STANDALONE, timeout=240
    )
    loss, grad = largest_differences(got[0], reference_steps("tiny", LENGTHS[4]))
    assert loss < TOLERANCE and grad < TOLERANCE, (loss, grad)


@pytest.mark.skipif(importlib.util.find_spec("transformers") is None, reason="needs transformers")
def test_cp2_transformers_llama_sdpa_matches_one_process(dist_pool):
    got = dist_pool(2).run(train_cp, "llama", LENGTHS[2], "alltoall", True, timeout=180)
    assert "got labels without shift_labels" in got[0][-1].pop("labels refused")
    got[1][-1].pop("labels refused")
    loss, grad = largest_differences(got[0], reference_steps("llama", LENGTHS[2]))
    assert loss < TOLERANCE and grad < TOLERANCE, (loss, grad)


def train_dp_shard_and_cp(length: int, steps: int) -> list[dict]:
    """4 processes: dp_shard 2 x cp 2. The prepared loader gives both ranks of a cp group the same
    sequence, the two cp groups the two sequences of a step; FSDP2 shards over all 4 (dp_shard_cp)."""

    from cadence import Accelerator
    from cadence.plugins import FullyShardedDataParallelPlugin, ParallelismConfig

    acc = Accelerator(
        parallelism_config=ParallelismConfig(dp_shard_size=2, cp_size=2),
        fsdp_plugin=FullyShardedDataParallelPlugin(fsdp_version=2),
    )
    rows = torch.cat([step_tokens(step, length) for step in range(steps)])
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(rows), batch_size=1)
    model = make_tiny()
    optimizer = torch.optim.SGD(model.parameters(), lr=LEARNING_RATE)
    model, optimizer, loader = acc.prepare(model, optimizer, loader)
    assert next(iter(model.parameters())).device_mesh.size() == 4  # sharded over dp_shard_cp
    records = []
    for step, (tokens,) in enumerate(loader):
        inputs = batch(step, length, tokens)
        mesh = acc.state.parallelism_config.get_device_mesh("cpu")
        seen = [None] * 4
        torch.distributed.all_gather_object(seen, tokens.tolist())
        cp_ranks = mesh["cp"].mesh.tolist()  # the global ranks of this rank's cp group
        same_in_cp_group = seen[cp_ranks[cp_ranks.index(acc.process_index) ^ 1]]
        buffers = [inputs["input_ids"], inputs["labels"], inputs["position_ids"]]
        with acc.maybe_context_parallel(buffers=buffers, buffer_seq_dims=[1, 1, 1]):
            assert inputs["input_ids"].shape == (1, length // 2)
            loss = loss_of(logits_of(model, inputs), inputs["labels"])
            acc.backward(loss)
        grads = {n: p.grad.full_tensor().clone() for n, p in model.named_parameters()}
        records.append(
            {"loss": acc.reduce(loss.detach(), "mean").item(), "grads": grads,
             "cp_peer_same_batch": same_in_cp_group == tokens.tolist()}
        )  # fmt: skip
        optimizer.step()
        optimizer.zero_grad()
    return records


def test_dp_shard_and_cp_on_a_2x2_mesh_match_one_process(dist_pool):
    got = dist_pool(4).run(train_dp_shard_and_cp, 8, 2, timeout=240)
    assert all(r["cp_peer_same_batch"] for rank in got for r in rank)
    loss, grad = largest_differences(got[0], reference_steps("tiny", [8, 8]))
    assert loss < TOLERANCE and grad < TOLERANCE, (loss, grad)


def cp_refusals() -> dict[str, str]:
    """Each input context parallelism cannot make exact, on a prepared CP model: the error text."""
    acc = _accelerator("allgather", fsdp=True)
    model = acc.prepare(make_tiny())
    messages = {}

    def attempt(name, length=8, mask=None, positions=True, buffers_of=None):
        inputs = batch(0, length)
        buffers = [inputs["input_ids"], inputs["labels"]] + ([inputs["position_ids"]] * positions)
        if buffers_of is not None:
            buffers = buffers_of(inputs)
        try:
            with acc.maybe_context_parallel(buffers=buffers, buffer_seq_dims=[1] * len(buffers)):
                kwargs = {"position_ids": inputs["position_ids"], "attention_mask": mask}
                model(inputs["input_ids"], **kwargs).sum().backward()
        except ValueError as error:
            messages[name] = str(error)

    # A mask that masks nothing is turned into is_causal=True: no error.
    attempt("all-ones mask", mask=torch.ones(2, 4, dtype=torch.long))
    attempt("positions not a buffer", positions=False)
    attempt("length not divisible", length=7)
    attempt("no buffers", buffers_of=lambda inputs: [])
    row = torch.randint(0, 32, (1, 9))  # input_ids and labels as views of one row of tokens
    attempt("shared memory", buffers_of=lambda inputs: [row[:, :-1], row[:, 1:]])
    padding = torch.ones(2, 4, dtype=torch.long)
    padding[0, -1] = 0  # a padded token: not a causal mask
    attempt("padding mask", mask=padding)  # last: it stops a forward half-way
    return messages


def test_cp_refuses_what_it_cannot_compute_exactly(dist_pool):
    messages = dist_pool(2).run(cp_refusals)
    for rank, found in enumerate(messages):
        assert set(found) == {
            "padding mask", "positions not a buffer", "length not divisible", "no buffers",
            "shared memory",
        }, found  # fmt: skip
        assert "Buffers 0 and 1 of maybe_context_parallel share memory" in found["shared memory"]
        assert found["padding mask"].startswith(
            f"[rank {rank}] Context parallelism got an attention"
        )
        assert "CADENCE_CP_DROP_ATTENTION_MASK=1" in found["padding mask"]
        assert "position_ids passed as a buffer" in found["positions not a buffer"]
        assert "length 7 is not divisible by cp_size=2" in found["length not divisible"]
        assert "needs buffers" in found["no buffers"]


def cp_with_sliding_window() -> None:
    from transformers import MistralConfig, MistralForCausalLM

    acc = _accelerator("allgather", fsdp=True)
    config = MistralConfig(
        vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=2, sliding_window=4,
    )  # fmt: skip
    acc.prepare(MistralForCausalLM(config))


@pytest.mark.skipif(importlib.util.find_spec("transformers") is None, reason="needs transformers")
def test_cp_refuses_a_sliding_window_model_on_every_rank(dist_pool):
    with pytest.raises(WorkerError) as error:
        dist_pool(2).run(cp_with_sliding_window, timeout=60)
    text = str(error.value)
    for rank in (0, 1):
        assert f"[rank {rank}] Context parallelism cannot train MistralForCausalLM" in text
    assert "config.sliding_window=4" in text


def cp_without_fsdp() -> str:
    try:
        _accelerator("allgather", fsdp=False)
    except ValueError as error:
        return str(error)
    return "accepted"


def test_cp_without_fsdp2_is_refused_unless_standalone_is_allowed(dist_pool):
    refused = dist_pool(2).run(cp_without_fsdp)
    assert all("cp_size > 1 (context parallelism) needs FSDP2" in r for r in refused), refused
    assert all("ACCELERATE_ALLOW_CP_STANDALONE=true" in r for r in refused)
    assert dist_pool(2).run(cp_without_fsdp, env=STANDALONE) == ["accepted"] * 2


def test_cp_with_fsdp1_or_deepspeed_is_refused_before_any_process_starts():
    from cadence.plugins import FullyShardedDataParallelPlugin, ParallelismConfig
    from cadence.plugins.resolve import resolve_parallel_plugins

    cases = [(FullyShardedDataParallelPlugin(fsdp_version=1), None, "uses FSDP1")]
    if importlib.util.find_spec("deepspeed") is not None:
        from cadence.plugins import DeepSpeedPlugin

        cases.append((None, DeepSpeedPlugin(zero_stage=2), "cannot run with DeepSpeed"))
    for fsdp, deepspeed, expected in cases:
        with pytest.raises(ValueError, match=expected):
            resolve_parallel_plugins(
                fsdp_plugin=fsdp, deepspeed_plugins=deepspeed, torch_tp_plugin=None,
                parallelism_config=ParallelismConfig(cp_size=2), launch={},
            )  # fmt: skip


def test_maybe_context_parallel_without_cp_warns_once_and_does_nothing(caplog):
    from cadence import Accelerator

    acc = Accelerator(cpu=True)
    inputs = batch(0, 8)
    with caplog.at_level(logging.WARNING):
        for _ in range(3):
            with acc.maybe_context_parallel(buffers=[inputs["input_ids"]], buffer_seq_dims=[1]):
                assert inputs["input_ids"].shape == (2, 8)  # not split
    warnings = [
        r for r in caplog.records if "Context parallel training is not enabled" in r.message
    ]
    assert len(warnings) == 1


def test_cpu_ring_attention_is_version_checked(monkeypatch):
    from cadence.strategies import cp_cpu_attention

    assert cp_cpu_attention.cpu_support_problem() is None  # this torch is the supported one
    monkeypatch.setattr(torch, "__version__", "2.99.0")
    with pytest.raises(RuntimeError, match=r"needs torch 2\.13 \(this is torch 2\.99\.0\)"):
        cp_cpu_attention.check_cpu_support()


def test_sequence_parallelism_without_deepspeed_is_refused_before_any_process_starts():
    from cadence.plugins import DeepSpeedSequenceParallelConfig, ParallelismConfig
    from cadence.plugins.resolve import resolve_parallel_plugins

    config = ParallelismConfig(
        sp_size=2, sp_backend="deepspeed", sp_handler=DeepSpeedSequenceParallelConfig()
    )
    with pytest.raises(ValueError, match=r"sp_size=2 \(sequence parallelism.*needs DeepSpeed"):
        resolve_parallel_plugins(
            fsdp_plugin=None, deepspeed_plugins=None, torch_tp_plugin=None,
            parallelism_config=config, launch={},
        )  # fmt: skip


# On GPUs: NCCL, torch's own CUDA ring-attention kernels, bf16. Two GPUs or more; skipped elsewhere.
CUDA_SCRIPT = """
import os, sys, torch
from cp_helpers import LENGTHS_CUDA, batch, logits_of, loss_of, make_tiny, LEARNING_RATE
from cadence import Accelerator
from cadence.plugins import FullyShardedDataParallelPlugin, ParallelismConfig, TorchContextParallelConfig
from torch.distributed.tensor import DTensor

rotate, out = sys.argv[1], sys.argv[2]
acc = Accelerator(
    parallelism_config=ParallelismConfig(
        cp_size=2, cp_handler=TorchContextParallelConfig(cp_comm_strategy=rotate)
    ),
    fsdp_plugin=FullyShardedDataParallelPlugin(fsdp_version=2),
)
model = make_tiny()
optimizer = torch.optim.SGD(model.parameters(), lr=LEARNING_RATE)
model, optimizer = acc.prepare(model, optimizer)
records = []
for step, length in enumerate(LENGTHS_CUDA):
    inputs = {k: v.to(acc.device) for k, v in batch(step, length).items()}
    buffers = [inputs["input_ids"], inputs["labels"], inputs["position_ids"]]
    with acc.maybe_context_parallel(buffers=buffers, buffer_seq_dims=[1, 1, 1]):
        loss = loss_of(logits_of(model, inputs), inputs["labels"])
        acc.backward(loss)
    grads = {}
    for name, param in acc.unwrap_model(model).named_parameters():
        grad = param.grad
        grads[name] = (grad.full_tensor() if isinstance(grad, DTensor) else grad).float().cpu()
    records.append({"loss": acc.reduce(loss.detach().float(), "mean").item(), "grads": grads})
    optimizer.step()
    optimizer.zero_grad()
if acc.is_main_process:
    torch.save(records, out)
"""


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA devices (NCCL)")
@pytest.mark.parametrize("rotate", ["allgather", "alltoall"])
def test_cp2_on_cuda_matches_one_process(tmp_path, rotate):
    import os
    import subprocess
    import sys
    from pathlib import Path

    from cp_helpers import LENGTHS_CUDA

    script = tmp_path / "cp_cuda.py"
    script.write_text(CUDA_SCRIPT)
    out = tmp_path / "records.pt"
    tests = str(Path(__file__).parent)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([tests, os.environ.get("PYTHONPATH", "")])}
    subprocess.run(
        [sys.executable, "-m", "cadence.commands.cli", "launch", "--num_processes", "2",
         str(script), rotate, str(out)],
        env=env, check=True, timeout=300,
    )  # fmt: skip
    got = torch.load(out, weights_only=True)
    # The one-process reference runs on the CPU (math attention); the GPU kernels differ from it by
    # rounding only, so the bound is looser than the CPU tests' 1e-5.
    loss, grad = largest_differences(got, reference_steps("tiny", LENGTHS_CUDA))
    assert loss < 1e-4 and grad < 1e-4, (loss, grad)
