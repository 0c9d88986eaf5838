"""Tensor parallelism through ParallelismConfig on real gloo processes: the model's plan splits its
layers, ranks of one tensor parallel group read the same batches, and training matches one process on
the same global batches — alone on 2 processes, and composed with FSDP2 on a 2x2 mesh (4 processes)."""

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


def train_tp(
    micro_batches,
    tp_size=2,
    dp_shard_size=1,
    accumulation=1,
    mixed_precision="no",
    clip=None,
    optimizer="adamw",
):
    from torch.distributed.tensor import DTensor

    from cadence import Accelerator
    from cadence.plugins import FullyShardedDataParallelPlugin, ParallelismConfig

    config = ParallelismConfig(tp_size=tp_size, dp_shard_size=dp_shard_size)
    fsdp = FullyShardedDataParallelPlugin(fsdp_version=2) if dp_shard_size > 1 else None
    acc = Accelerator(
        parallelism_config=config,
        fsdp_plugin=fsdp,
        gradient_accumulation_steps=accumulation,
        mixed_precision=mixed_precision,
    )
    model = make_model()
    optimizer = make_optimizer(model, optimizer)
    model, optimizer = acc.prepare(model, optimizer)
    up = model.blocks[0].up.weight
    assert isinstance(up, DTensor) and up.to_local().numel() == up.numel() // (
        tp_size * dp_shard_size
    )
    assert {id(p) for g in optimizer.param_groups for p in g["params"]} == {
        id(p) for p in model.parameters()
    }
    train_with(acc, model, optimizer, GLOBAL_BATCH, micro_batches, dp_size=dp_shard_size, clip=clip)
    return acc.get_state_dict(model)


@pytest.mark.parametrize(
    "options,tolerance",
    [
        pytest.param({}, 1e-5, id="plain"),
        pytest.param({"accumulation": 2, "clip": 0.05}, 1e-5, id="accumulation-clip"),
        pytest.param({"mixed_precision": "bf16", "optimizer": "sgd"}, 2e-3, id="bf16"),
    ],
)
def test_tensor_parallel_matches_single_process(dist_pool, options, tolerance):
    results = dist_pool(2).run(train_tp, 4, **options)
    reference = reference_training(
        GLOBAL_BATCH,
        4,
        accumulation=options.get("accumulation", 1),
        mixed_precision=options.get("mixed_precision", "no"),
        clip=options.get("clip"),
        optimizer=options.get("optimizer", "adamw"),
    )
    assert max_difference(results[0], reference) < tolerance


def test_tensor_parallel_with_fsdp2_on_a_2d_mesh(dist_pool):
    results = dist_pool(4).run(train_tp, 4, dp_shard_size=2, accumulation=2, timeout=180)
    assert all(r == {} for r in results[1:])
    reference = reference_training(GLOBAL_BATCH, 4, accumulation=2)
    assert max_difference(results[0], reference) < 1e-5


def tp_checkpoint(directory, phase):
    from cadence import Accelerator
    from cadence.plugins import ParallelismConfig

    acc = Accelerator(parallelism_config=ParallelismConfig(tp_size=2))
    model = make_model(seed=0 if phase == "save" else 42)
    optimizer = make_optimizer(model)
    model, optimizer = acc.prepare(model, optimizer)
    if phase == "save":
        train_with(acc, model, optimizer, GLOBAL_BATCH, 2, dp_size=1)
        acc._strategy.save_sharded_state(directory, [model], [optimizer])
    else:
        acc._strategy.load_sharded_state(directory, [model], [optimizer])
    return acc.get_state_dict(model)


def test_tensor_parallel_sharded_checkpoint_round_trip(dist_pool, tmp_path):
    pool = dist_pool(2)
    saved = pool.run(tp_checkpoint, str(tmp_path), "save")
    loaded = pool.run(tp_checkpoint, str(tmp_path), "load")
    assert max_difference(saved[0], loaded[0]) == 0
    assert max_difference(saved[0], reference_training(GLOBAL_BATCH, 2)) < 1e-5
    assert (tmp_path / "pytorch_model_fsdp_0" / ".metadata").is_file()
    assert (tmp_path / "optimizer_0" / ".metadata").is_file()


def tp_with_bad_plan():
    from cadence import Accelerator
    from cadence.plugins import ParallelismConfig, TorchTensorParallelConfig

    plan = {"blocks.*.gate": "colwise"}
    config = ParallelismConfig(tp_size=2, tp_handler=TorchTensorParallelConfig(tp_plan=plan))
    acc = Accelerator(parallelism_config=config)
    model = make_model()
    acc.prepare(model, make_optimizer(model))


def test_a_plan_naming_a_missing_module_fails_on_every_rank(dist_pool):
    with pytest.raises(WorkerError) as error:
        dist_pool(2).run(tp_with_bad_plan, timeout=60)
    message = str(error.value)
    assert (
        "[rank 0] The tensor parallel plan" in message
        and "[rank 1] The tensor parallel plan" in message
    )


def tp_size_mismatch():
    from cadence import Accelerator
    from cadence.plugins import ParallelismConfig

    Accelerator(parallelism_config=ParallelismConfig(tp_size=4))


def test_sizes_must_multiply_to_the_number_of_processes(dist_pool):
    with pytest.raises(WorkerError, match="total_size"):
        dist_pool(2).run(tp_size_mismatch, timeout=60)


def deprecated_tp_plugin_and_data_coordinates():
    from cadence import Accelerator
    from cadence.plugins import TorchTensorParallelPlugin

    acc = Accelerator(torch_tp_plugin=TorchTensorParallelPlugin(tp_size=2))
    loader = acc.prepare(__import__("torch").utils.data.DataLoader(list(range(8)), batch_size=4))
    return acc.parallelism_config.tp_size, [batch.tolist() for batch in loader]


def test_tp_ranks_read_the_same_batches(dist_pool):
    results = dist_pool(2).run(deprecated_tp_plugin_and_data_coordinates)
    assert results[0] == results[1] == (2, [[0, 1, 2, 3], [4, 5, 6, 7]])


def test_parallelism_config_checks_its_sizes():
    from cadence.plugins import ParallelismConfig

    config = ParallelismConfig(dp_shard_size=2, tp_size=2)
    assert config.total_size == 4 and config.fsdp_dim_names == ["dp_shard_cp"]
    assert config._get_mesh() == (("dp_shard", "tp"), (2, 2))
    assert ParallelismConfig(dp_replicate_size=2, dp_shard_size=2).fsdp_dim_names == [
        "dp_replicate",
        "dp_shard_cp",
    ]
    with pytest.raises(ValueError, match="pure replication"):
        ParallelismConfig(dp_replicate_size=2, tp_size=2)
    with pytest.raises(ValueError, match="at least 1"):
        ParallelismConfig(tp_size=0)


def accelerator_round_trip(directory, phase):
    from sharded_helpers import save_state_round_trip

    from cadence import Accelerator
    from cadence.plugins import ParallelismConfig

    acc = Accelerator(parallelism_config=ParallelismConfig(tp_size=2))
    return save_state_round_trip(acc, directory, phase, GLOBAL_BATCH, dp_rank=0, dp_size=1)


def test_save_state_and_load_state_resume_exactly(dist_pool, tmp_path):
    pool = dist_pool(2)
    saved = pool.run(accelerator_round_trip, str(tmp_path / "ckpt"), "save")
    loaded = pool.run(accelerator_round_trip, str(tmp_path / "ckpt"), "load")
    assert max_difference(saved[0], loaded[0]) == 0
    assert max_difference(saved[0], reference_training(GLOBAL_BATCH, 4)) < 1e-5
