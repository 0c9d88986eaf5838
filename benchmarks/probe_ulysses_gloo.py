"""Probe: DeepSpeed Ulysses sequence parallelism on 2 CPU processes over gloo, without Cadence.

It shows what the Cadence wiring of `sp_size > 1` will build on: `register_with_transformers` gives
the mpu, `deepspeed.initialize(mpu=...)` builds the engine, `UlyssesSPDataLoaderAdapter` splits one
sample across the sequence-parallel group and adds `shift_labels`, and forward and backward run through
the all-to-all on gloo. Run it with

    DS_ACCELERATOR=cpu cadence launch --cpu --num_processes 2 benchmarks/probe_ulysses_gloo.py

On a loaded 2-core machine (load average 20) it takes one to two minutes, most of it importing
(`deepspeed.initialize` pulls in torch._inductor) and the interpreter's garbage collection at exit;
a watchdog prints every thread's stack if it has not finished after five minutes.
"""

from __future__ import annotations

import faulthandler
import os

import torch
import torch.distributed as dist

WATCHDOG_SECONDS = 300
VOCAB = 64
SEQUENCE = 8
SP_SIZE = 2


def log(*parts: object) -> None:
    """Print with the rank in front, flushed (the point is to see where a run stops)."""
    print(f"[rank {os.environ.get('RANK')}]", *parts, flush=True)


def main() -> None:
    """Build the engine with Ulysses' mpu, feed it one adapted batch, run forward and backward."""
    faulthandler.dump_traceback_later(WATCHDOG_SECONDS, exit=True)
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    import deepspeed
    import deepspeed.ops
    from deepspeed.runtime.sequence_parallel.ulysses_sp import (
        UlyssesSPAttentionHF,
        UlyssesSPDataLoaderAdapter,
    )
    from transformers import LlamaConfig, LlamaForCausalLM

    # Skip the shared-memory all-reduce op: compiling it takes minutes on a fresh machine.
    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
    deepspeed.init_distributed(dist_backend="gloo")
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
    )
    model = LlamaForCausalLM._from_config(config, attn_implementation="sdpa")
    mpu = UlyssesSPAttentionHF.register_with_transformers(
        model_name_or_path=model,
        core_attn_implementation="sdpa",
        sequence_parallel_size=SP_SIZE,
        micro_batch_size=1,
        seq_length_is_variable=True,
    )
    log("mpu ready")
    ds_config = {
        "train_micro_batch_size_per_gpu": 1,
        # data-parallel size is world / sp = 1
        "train_batch_size": 1,
        "gradient_accumulation_steps": 1,
        "zero_optimization": {"stage": 1},
        "zero_allow_untested_optimizer": True,
    }
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    engine, *_ = deepspeed.initialize(model=model, optimizer=optimizer, config=ds_config, mpu=mpu)
    log("engine ready")
    ids = torch.randint(0, VOCAB, (1, SEQUENCE), generator=torch.Generator().manual_seed(1))
    batches = [
        {"input_ids": ids, "labels": ids.clone(), "position_ids": torch.arange(SEQUENCE)[None]}
    ]
    adapter = UlyssesSPDataLoaderAdapter(
        batches,
        sp_rank=mpu.get_sequence_parallel_rank(),
        sp_group=mpu.get_sequence_parallel_group(),
        sp_world_size=SP_SIZE,
        device=torch.device("cpu"),
    )
    batch = next(iter(adapter))
    log("shard", {k: tuple(v.shape) for k, v in batch.items()})
    logits = engine(input_ids=batch["input_ids"], position_ids=batch["position_ids"]).logits
    loss = torch.nn.functional.cross_entropy(
        logits.reshape(-1, VOCAB), batch["shift_labels"].reshape(-1), ignore_index=-100
    )
    engine.backward(loss)
    log("forward and backward done, local loss", float(loss.detach()))
    dist.destroy_process_group()
    faulthandler.cancel_dump_traceback_later()


if __name__ == "__main__":
    main()
