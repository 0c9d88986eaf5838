"""FSDP version 1 on 2 real gloo processes (CPU): every sharding strategy trains like one process on the
same global batches, an optimizer built before prepare() follows the flat parameters, module states
sync from rank 0 without FSDP1's CPU-broken path, checkpoints resume, and CPU offload is refused."""

from __future__ import annotations

import pytest
from sharded_helpers import (
    make_model,
    make_optimizer,
    max_difference,
    reference_training,
    train_with,
)

from harness import WorkerError

GLOBAL_BATCH = 16


def _accelerator(accumulation=1, mixed_precision="no", **plugin_kwargs):
    from cadence import Accelerator
    from cadence.plugins import FullyShardedDataParallelPlugin

    plugin_kwargs.setdefault("auto_wrap_policy", "transformer_based_wrap")
    plugin_kwargs.setdefault("transformer_cls_names_to_wrap", ["Block"])
    plugin = FullyShardedDataParallelPlugin(fsdp_version=1, **plugin_kwargs)
    return Accelerator(
        fsdp_plugin=plugin,
        gradient_accumulation_steps=accumulation,
        mixed_precision=mixed_precision,
    )


def train_fsdp1(
    micro_batches,
    accumulation=1,
    mixed_precision="no",
    clip=None,
    seed_by_rank=False,
    optimizer="adamw",
    **plugin,
):
    from torch.distributed.fsdp import FullyShardedDataParallel

    acc = _accelerator(accumulation, mixed_precision, **plugin)
    assert not acc.is_fsdp2
    model = make_model(seed=acc.process_index if seed_by_rank else 0)
    optimizer = make_optimizer(model, optimizer)
    model, optimizer = acc.prepare(model, optimizer)
    assert isinstance(model, FullyShardedDataParallel)
    assert type(acc.unwrap_model(model)).__name__ == "Net"
    train_with(acc, model, optimizer, GLOBAL_BATCH, micro_batches, clip=clip)
    return acc.get_state_dict(model)


CASES = [
    pytest.param({}, 1e-5, id="full-shard-flat-params"),
    pytest.param({"use_orig_params": True, "accumulation": 2}, 1e-5, id="orig-params-accumulation"),
    pytest.param(
        {"sharding_strategy": "SHARD_GRAD_OP", "clip": 0.05}, 1e-5, id="shard-grad-op-clip"
    ),
    pytest.param({"sharding_strategy": "NO_SHARD"}, 1e-5, id="no-shard"),
    pytest.param(
        {"mixed_precision": "bf16", "accumulation": 2, "optimizer": "sgd"},
        2e-3,
        id="bf16-accumulation",
    ),
    pytest.param({"sync_module_states": True, "seed_by_rank": True}, 1e-5, id="sync-module-states"),
]


@pytest.mark.parametrize("options,tolerance", CASES)
def test_fsdp1_matches_single_process(dist_pool, options, tolerance):
    results = dist_pool(2).run(train_fsdp1, 4, **options)
    assert results[1] == {}
    reference = reference_training(
        GLOBAL_BATCH,
        4,
        accumulation=options.get("accumulation", 1),
        mixed_precision=options.get("mixed_precision", "no"),
        clip=options.get("clip"),
        optimizer=options.get("optimizer", "adamw"),
    )
    assert max_difference(results[0], reference) < tolerance


def fsdp1_checkpoint(directory, phase, state_dict_type):
    acc = _accelerator(state_dict_type=state_dict_type, use_orig_params=True)
    model = make_model(seed=0 if phase == "save" else 42)
    optimizer = make_optimizer(model)
    model, optimizer = acc.prepare(model, optimizer)
    if phase == "save":
        train_with(acc, model, optimizer, GLOBAL_BATCH, 2)
        acc._strategy.save_sharded_state(directory, [model], [optimizer])
    else:
        acc._strategy.load_sharded_state(directory, [model], [optimizer])
    return acc.get_state_dict(model)


@pytest.mark.parametrize("state_dict_type", ["FULL_STATE_DICT", "SHARDED_STATE_DICT"])
def test_fsdp1_checkpoint_round_trip(dist_pool, tmp_path, state_dict_type):
    pool = dist_pool(2)
    saved = pool.run(fsdp1_checkpoint, str(tmp_path), "save", state_dict_type, timeout=60)
    loaded = pool.run(fsdp1_checkpoint, str(tmp_path), "load", state_dict_type, timeout=60)
    assert max_difference(saved[0], loaded[0]) == 0
    assert max_difference(saved[0], reference_training(GLOBAL_BATCH, 2)) < 1e-5


def fsdp1_with_cpu_offload():
    _accelerator(cpu_offload=True)


def test_fsdp1_cpu_offload_on_cpu_is_refused_on_every_rank(dist_pool):
    with pytest.raises(WorkerError) as error:
        dist_pool(2).run(fsdp1_with_cpu_offload, timeout=60)
    message = str(error.value)
    assert "[rank 0] FSDP1 CPU offload" in message and "[rank 1] FSDP1 CPU offload" in message
    assert "fsdp_version=2" in message


def accelerator_round_trip(directory, phase):
    from sharded_helpers import save_state_round_trip

    acc = _accelerator(state_dict_type="FULL_STATE_DICT")  # FSDP1's default
    return save_state_round_trip(acc, directory, phase, GLOBAL_BATCH, acc.process_index, 2)


def test_save_state_and_load_state_resume_exactly(dist_pool, tmp_path):
    pool = dist_pool(2)
    saved = pool.run(accelerator_round_trip, str(tmp_path / "ckpt"), "save")
    loaded = pool.run(accelerator_round_trip, str(tmp_path / "ckpt"), "load")
    assert max_difference(saved[0], loaded[0]) == 0
    assert max_difference(saved[0], reference_training(GLOBAL_BATCH, 4)) < 1e-5
