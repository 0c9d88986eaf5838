"""FSDP2 (`fully_shard`) on 2 real gloo processes: training matches one process on the same global
batches (plain, accumulation, bf16, clipping), sharded checkpoints resume exactly, the gathered state
dict and `cadence merge-weights` give the whole model, and bad input fails before anything hangs."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
from sharded_helpers import (
    make_model,
    make_optimizer,
    max_difference,
    needs_fsdp2_on_cpu,
    needs_fsdp2_on_one_cpu,
    reference_training,
    save_state_round_trip,
    train_by_index,
    train_with,
)

from harness import WorkerError

GLOBAL_BATCH = 16


def _accelerator(version=2, **plugin_kwargs):
    from cadence import Accelerator
    from cadence.plugins import FullyShardedDataParallelPlugin

    accelerator_kwargs = {
        k: plugin_kwargs.pop(k)
        for k in ("gradient_accumulation_steps", "mixed_precision")
        if k in plugin_kwargs
    }
    plugin_kwargs.setdefault("auto_wrap_policy", "transformer_based_wrap")
    plugin_kwargs.setdefault("transformer_cls_names_to_wrap", ["Block"])
    plugin = FullyShardedDataParallelPlugin(fsdp_version=version, **plugin_kwargs)
    return Accelerator(fsdp_plugin=plugin, **accelerator_kwargs)


def train_fsdp(
    micro_batches,
    accumulation=1,
    mixed_precision="no",
    clip=None,
    version=2,
    optimizer="adamw",
    seed_by_rank=False,
    **plugin,
):
    from torch.distributed.tensor import DTensor

    from cadence import DistributedType

    acc = _accelerator(
        version, gradient_accumulation_steps=accumulation, mixed_precision=mixed_precision, **plugin
    )
    assert acc.distributed_type == DistributedType.FSDP and acc.is_fsdp2 == (version == 2)
    if mixed_precision == "bf16":  # FSDP gathers bf16 parameters for compute
        assert acc.state.fsdp_plugin.mixed_precision_policy.param_dtype == torch.bfloat16
    model = make_model(seed=acc.process_index if seed_by_rank else 0)
    total = sum(p.numel() for p in model.parameters())
    optimizer = make_optimizer(model, optimizer)
    model, optimizer = acc.prepare(model, optimizer)
    if version == 2:
        params = list(model.parameters())
        assert all(isinstance(p, DTensor) for p in params)
        # The optimizer now trains the sharded parameters, and each rank holds half of them.
        assert {id(p) for g in optimizer.param_groups for p in g["params"]} == {
            id(p) for p in params
        }
        local = sum(p.to_local().numel() for p in params)
        assert local <= total // 2 + 2 * len(params), (local, total)
    train_with(acc, model, optimizer, GLOBAL_BATCH, micro_batches, clip=clip)
    return acc.get_state_dict(model)  # whole on the main process, empty on the others


CASES = [
    pytest.param({}, 1e-5, id="plain"),
    pytest.param({"accumulation": 2}, 1e-5, id="accumulation"),
    pytest.param({"clip": 0.05}, 1e-5, id="clip"),
    pytest.param(
        {"mixed_precision": "bf16", "accumulation": 2, "optimizer": "sgd"},
        2e-3,
        id="bf16-accumulation",
    ),
    pytest.param(
        {"reshard_after_forward": False, "cpu_offload": True}, 1e-5, id="no-reshard-offload"
    ),
    # Only the main process's weights count: the others are built differently and overwritten.
    pytest.param(
        {"cpu_ram_efficient_loading": True, "seed_by_rank": True}, 1e-5, id="ram-efficient-loading"
    ),
]


@needs_fsdp2_on_cpu
@pytest.mark.parametrize("options,tolerance", CASES)
def test_fsdp2_matches_single_process(dist_pool, options, tolerance):
    micro_batches = 4
    results = dist_pool(2).run(train_fsdp, micro_batches, **options)
    assert results[1] == {}
    reference = reference_training(
        GLOBAL_BATCH,
        micro_batches,
        accumulation=options.get("accumulation", 1),
        mixed_precision=options.get("mixed_precision", "no"),
        clip=options.get("clip"),
        optimizer=options.get("optimizer", "adamw"),
    )
    assert max_difference(results[0], reference) < tolerance


def sharded_checkpoint_round_trip(
    directory, phase, version=2, state_dict_type="SHARDED_STATE_DICT"
):
    """phase "save": train 2 steps, save, train 2 more. phase "load": fresh model, load, train 2."""
    acc = _accelerator(version, state_dict_type=state_dict_type)
    model = make_model(
        seed=0 if phase == "save" else 99
    )  # a different start: loading must overwrite it
    optimizer = make_optimizer(model)
    model, optimizer = acc.prepare(model, optimizer)
    if phase == "save":
        train_with(acc, model, optimizer, GLOBAL_BATCH, 2)
        files = acc._strategy.save_sharded_state(directory, [model], [optimizer])
        acc.wait_for_everyone()
    else:
        acc._strategy.load_sharded_state(directory, [model], [optimizer])
        files = []
    train_by_index(acc, model, optimizer, GLOBAL_BATCH, 2, 2, acc.process_index, acc.num_processes)
    state = acc.get_state_dict(model)
    return (state, files) if acc.is_main_process else (None, files)


@needs_fsdp2_on_cpu
@pytest.mark.parametrize("state_dict_type", ["SHARDED_STATE_DICT", "FULL_STATE_DICT"])
def test_fsdp2_checkpoint_resumes_identically(dist_pool, tmp_path, state_dict_type):
    pool = dist_pool(2)
    saved = pool.run(
        sharded_checkpoint_round_trip, str(tmp_path), "save", state_dict_type=state_dict_type
    )
    loaded = pool.run(
        sharded_checkpoint_round_trip, str(tmp_path), "load", state_dict_type=state_dict_type
    )
    assert max_difference(saved[0][0], loaded[0][0]) < 1e-6
    assert max_difference(saved[0][0], reference_training(GLOBAL_BATCH, 4)) < 1e-5
    # Each rank reports the files it wrote, and together they are the whole folder.
    rank0, rank1 = set(saved[0][1]), set(saved[1][1])
    assert not rank0 & rank1
    on_disk = {
        os.path.relpath(os.path.join(root, name), tmp_path)
        for root, _, names in os.walk(tmp_path)
        for name in names
    }
    assert rank0 | rank1 == on_disk
    if state_dict_type == "SHARDED_STATE_DICT":
        assert rank1 and any(name.startswith("pytorch_model_fsdp_0/") for name in rank1)
    else:
        assert rank0 == {"pytorch_model_fsdp.bin", "optimizer.bin"} and not rank1


@needs_fsdp2_on_cpu
def test_merge_weights_command_gives_the_whole_model(dist_pool, tmp_path):
    from safetensors.torch import load_file

    checkpoint = tmp_path / "checkpoint"
    saved = dist_pool(2).run(sharded_checkpoint_round_trip, str(checkpoint), "save")
    out = tmp_path / "merged"
    command = [sys.executable, "-m", "cadence.commands.cli", "merge-weights"]
    done = subprocess.run(
        command + [str(checkpoint / "pytorch_model_fsdp_0"), str(out)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    merged = load_file(out / "model.safetensors")
    # The merged file holds the weights at save time: 2 steps of training.
    assert max_difference(merged, reference_training(GLOBAL_BATCH, 2)) < 1e-5
    model = make_model(seed=5)
    model.load_state_dict(merged)  # loads into a plain, unsharded model
    assert saved[0][0] is not None

    bad = subprocess.run(
        command + [str(tmp_path / "nowhere"), str(out)], capture_output=True, text=True, timeout=120
    )
    assert bad.returncode != 0 and "nowhere" in bad.stderr


def save_consolidated(directory):
    acc = _accelerator()
    model = make_model()
    optimizer = make_optimizer(model)
    model, optimizer = acc.prepare(model, optimizer)
    train_with(acc, model, optimizer, GLOBAL_BATCH, 2)
    acc.save_model(model, directory)
    return sorted(os.listdir(directory)) if acc.is_main_process else None


@needs_fsdp2_on_cpu
def test_save_model_writes_one_unsharded_safetensors_set(dist_pool, tmp_path):
    from safetensors.torch import load_file

    files = dist_pool(2).run(save_consolidated, str(tmp_path))
    assert files[0] == ["model.safetensors"]
    model = make_model(seed=7)
    model.load_state_dict(load_file(tmp_path / "model.safetensors"))
    assert max_difference(model.state_dict(), reference_training(GLOBAL_BATCH, 2)) < 1e-5


def accelerator_round_trip(directory, phase, state_dict_type):
    acc = _accelerator(state_dict_type=state_dict_type)
    return save_state_round_trip(acc, directory, phase, GLOBAL_BATCH, acc.process_index, 2)


@needs_fsdp2_on_cpu
@pytest.mark.parametrize("state_dict_type", ["SHARDED_STATE_DICT", "FULL_STATE_DICT"])
def test_save_state_and_load_state_resume_exactly(dist_pool, tmp_path, state_dict_type):
    pool = dist_pool(2)
    saved = pool.run(accelerator_round_trip, str(tmp_path / "ckpt"), "save", state_dict_type)
    loaded = pool.run(accelerator_round_trip, str(tmp_path / "ckpt"), "load", state_dict_type)
    assert max_difference(saved[0], loaded[0]) == 0
    assert max_difference(saved[0], reference_training(GLOBAL_BATCH, 4)) < 1e-5
    assert (tmp_path / "ckpt" / "cadence_manifest.json").is_file()


def prepare_with_missing_layer_class():
    acc = _accelerator(transformer_cls_names_to_wrap=["DecoderLayer"])
    model, optimizer = make_model(), None
    optimizer = make_optimizer(model)
    acc.prepare(model, optimizer)


@needs_fsdp2_on_cpu
def test_wrap_policy_naming_an_absent_class_fails_on_every_rank(dist_pool):
    with pytest.raises(WorkerError) as error:
        dist_pool(2).run(prepare_with_missing_layer_class, timeout=60)
    message = str(error.value)
    assert message.count("DecoderLayer") >= 2 and "Block" in message  # both ranks, with the choices
    assert "[rank 0] Could not find" in message and "[rank 1] Could not find" in message


def test_plugin_reads_launcher_settings_and_checks_them():
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, ShardingStrategy

    from cadence.plugins import FullyShardedDataParallelPlugin
    from cadence.plugins.fsdp import fsdp_plugin_from_launch

    plugin = fsdp_plugin_from_launch(
        {"version": 2, "offload_params": True, "reshard_after_forward": "false",
         "auto_wrap_policy": "SIZE_BASED_WRAP", "min_num_params": 100}
    )  # fmt: skip
    assert plugin.reshard_after_forward is False and isinstance(
        plugin.cpu_offload, CPUOffloadPolicy
    )
    assert plugin.state_dict_type.name == "SHARDED_STATE_DICT"
    v1 = fsdp_plugin_from_launch({"version": 1, "sharding_strategy": "SHARD_GRAD_OP"})
    assert v1.sharding_strategy == ShardingStrategy.SHARD_GRAD_OP
    assert v1.state_dict_type.name == "FULL_STATE_DICT" and v1.use_orig_params is False
    bf16 = FullyShardedDataParallelPlugin(fsdp_version=2, mixed_precision_policy="bf16")
    assert isinstance(bf16.mixed_precision_policy, MixedPrecisionPolicy)
    assert bf16.mixed_precision_policy.param_dtype == torch.bfloat16
    with pytest.raises(ValueError, match="reshard_after_forward"):
        FullyShardedDataParallelPlugin(fsdp_version=2, reshard_after_forward="FULL_SHARD")
    with pytest.raises(ValueError, match="auto_wrap_policy"):
        FullyShardedDataParallelPlugin(auto_wrap_policy="layer_wise")
    with pytest.raises(ValueError, match="LOCAL_STATE_DICT"):
        FullyShardedDataParallelPlugin(fsdp_version=2, state_dict_type="LOCAL_STATE_DICT")


def train_as_launched():
    """A training script with no FSDP in its code: the launcher's settings make it sharded."""
    from cadence import Accelerator

    acc = Accelerator()
    model = make_model()
    optimizer = make_optimizer(model)
    model, optimizer = acc.prepare(model, optimizer)
    train_with(acc, model, optimizer, GLOBAL_BATCH, 4)
    plugin = acc.state.fsdp_plugin
    settings = (acc.distributed_type.value, acc.is_fsdp2, plugin.reshard_after_forward)
    return settings, acc.get_state_dict(model)


LAUNCH_RECORD = {
    "fsdp": {
        "version": 2,
        "reshard_after_forward": "false",
        "offload_params": False,
        "auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
        "transformer_layer_cls_to_wrap": "Block",
        "state_dict_type": "SHARDED_STATE_DICT",
    }
}
REFERENCE_ENV = {
    "ACCELERATE_USE_FSDP": "true",
    "FSDP_VERSION": "2",
    "FSDP_RESHARD_AFTER_FORWARD": "false",
    "FSDP_AUTO_WRAP_POLICY": "TRANSFORMER_BASED_WRAP",
    "FSDP_TRANSFORMER_CLS_TO_WRAP": "Block",
}


@needs_fsdp2_on_cpu
@pytest.mark.parametrize(
    "env",
    [{"CADENCE_LAUNCH_CONFIG": json.dumps(LAUNCH_RECORD)}, REFERENCE_ENV],
    ids=["cadence-launch-record", "accelerate-env-vars"],
)
def test_the_launch_settings_alone_turn_fsdp_on(dist_pool, env):
    results = dist_pool(2).run(train_as_launched, env=env)
    assert results[0][0] == results[1][0] == ("FSDP", True, False)
    assert max_difference(results[0][1], reference_training(GLOBAL_BATCH, 4)) < 1e-5


@pytest.mark.parametrize(
    "processes",
    [pytest.param("2", marks=needs_fsdp2_on_cpu), pytest.param("1", marks=needs_fsdp2_on_one_cpu)],
)
def test_cadence_launch_use_fsdp_runs_an_unchanged_script(tmp_path, processes):
    """CPU workers (--cpu excludes --use_fsdp, so the GPUs are hidden instead); with one process FSDP is
    kept too (the same code path as on many)."""
    script = tmp_path / "train.py"
    script.write_text(
        "import sys\n"
        f"sys.path.insert(0, {os.path.dirname(__file__)!r})\n"
        "from test_fsdp import train_as_launched, GLOBAL_BATCH\n"
        "from sharded_helpers import max_difference, reference_training\n"
        "settings, state = train_as_launched()\n"
        "if state:\n"
        "    print('RESULT', settings, max_difference(state, reference_training(GLOBAL_BATCH, 4)))\n"
    )
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("CADENCE_", "ACCELERATE_", "FSDP_"))
    }
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(name, None)
    env["CUDA_VISIBLE_DEVICES"] = ""
    flags = ["--num_processes", processes, "--use_fsdp", "--fsdp_version", "2"]
    flags += ["--fsdp_auto_wrap_policy", "TRANSFORMER_BASED_WRAP"]
    flags += [
        "--fsdp_transformer_layer_cls_to_wrap",
        "Block",
        "--fsdp_reshard_after_forward",
        "false",
    ]
    done = subprocess.run(
        [sys.executable, "-m", "cadence.commands.cli", "launch", *flags, str(script)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    line = next(line for line in done.stdout.splitlines() if line.startswith("RESULT"))
    assert "('FSDP', True, False)" in line
    assert float(line.split()[-1]) < 1e-5


def train_hybrid_sharded():
    from cadence import Accelerator
    from cadence.plugins import FullyShardedDataParallelPlugin, ParallelismConfig

    config = ParallelismConfig(dp_replicate_size=2, dp_shard_size=2)
    acc = Accelerator(
        fsdp_plugin=FullyShardedDataParallelPlugin(fsdp_version=2), parallelism_config=config
    )
    model = make_model()
    optimizer = make_optimizer(model)
    model, optimizer = acc.prepare(model, optimizer)
    weight = model.inp.weight  # replicated over dp_replicate, sharded over dp_shard
    assert weight.device_mesh.mesh_dim_names == ("dp_replicate", "dp_shard_cp")
    assert weight.to_local().numel() == weight.numel() // 2
    train_with(acc, model, optimizer, GLOBAL_BATCH, 4, dp_size=4)
    return acc.get_state_dict(model)


@needs_fsdp2_on_cpu
def test_hybrid_sharding_on_a_2x2_mesh(dist_pool):
    results = dist_pool(4).run(train_hybrid_sharded, timeout=180)
    assert max_difference(results[0], reference_training(GLOBAL_BATCH, 4)) < 1e-5


def train_fp16(version):
    from sharded_helpers import FP16_INIT_SCALE

    from cadence import Accelerator, GradScalerKwargs
    from cadence.plugins import FullyShardedDataParallelPlugin

    # fp32 parameters and reductions, fp16 autocast compute: the loss scaler does the work.
    third = "output_dtype" if version == 2 else "buffer_dtype"
    policy = {"param_dtype": torch.float32, "reduce_dtype": torch.float32, third: torch.float32}
    plugin = FullyShardedDataParallelPlugin(fsdp_version=version, mixed_precision_policy=policy)
    acc = Accelerator(
        fsdp_plugin=plugin,
        mixed_precision="fp16",
        kwargs_handlers=[GradScalerKwargs(init_scale=FP16_INIT_SCALE)],
    )
    model = make_model()
    optimizer = make_optimizer(model, "sgd")
    model, optimizer = acc.prepare(model, optimizer)
    train_with(acc, model, optimizer, GLOBAL_BATCH, 4)
    return type(acc.scaler).__name__, acc.get_state_dict(model)


@pytest.mark.parametrize("version", [pytest.param(2, marks=needs_fsdp2_on_cpu), 1])
def test_fp16_ranks_agree_through_a_sharded_grad_scaler(dist_pool, version):
    results = dist_pool(2).run(train_fp16, version)
    assert results[0][0] == results[1][0] == "ShardedGradScaler"
    reference = reference_training(GLOBAL_BATCH, 4, mixed_precision="fp16", optimizer="sgd")
    assert max_difference(results[0][1], reference) < 1e-3


def fsdp2_at_world_size_one(directory: str, phase: str):
    """One CPU process with an FSDP2 plugin: the FSDP code path (DTensor parameters, a process group of
    one) and the sharded checkpoint layout, as on many processes."""
    import torch.distributed as dist
    from torch.distributed.tensor import DTensor

    from cadence import Accelerator, DistributedType
    from cadence.plugins import FullyShardedDataParallelPlugin

    plugin = FullyShardedDataParallelPlugin(
        fsdp_version=2,
        auto_wrap_policy="transformer_based_wrap",
        transformer_cls_names_to_wrap=["Block"],
        state_dict_type="SHARDED_STATE_DICT",
    )
    acc = Accelerator(cpu=True, fsdp_plugin=plugin)
    assert acc.distributed_type == DistributedType.FSDP and acc.is_fsdp2
    assert acc.num_processes == 1 and dist.is_initialized() and dist.get_world_size() == 1
    model = make_model(seed=0 if phase == "save" else 42)
    optimizer = make_optimizer(model)
    model, optimizer = acc.prepare(model, optimizer)
    assert all(isinstance(p, DTensor) for p in model.parameters())
    if phase == "save":
        train_by_index(acc, model, optimizer, GLOBAL_BATCH, 0, 2, 0, 1)
        acc.save_state(directory)
    else:
        acc.load_state(directory)
    train_by_index(acc, model, optimizer, GLOBAL_BATCH, 2, 2, 0, 1)
    return acc.get_state_dict(model)


@needs_fsdp2_on_one_cpu
def test_fsdp2_at_world_size_one_keeps_the_fsdp_path_and_layout(dist_pool, tmp_path):
    pool = dist_pool(1)
    saved = pool.run(fsdp2_at_world_size_one, str(tmp_path), "save")[0]
    loaded = pool.run(fsdp2_at_world_size_one, str(tmp_path), "load")[0]
    # The sharded layout of many processes (torch.distributed.checkpoint folders), not a plain file.
    names = {
        os.path.relpath(os.path.join(root, name), tmp_path)
        for root, _, files in os.walk(tmp_path)
        for name in files
    }
    assert any(name.startswith("pytorch_model_fsdp_0/") for name in names), sorted(names)
    assert not any(name.endswith(("model.safetensors", "pytorch_model.bin")) for name in names)
    assert max_difference(saved, loaded) < 1e-6
    assert max_difference(saved, reference_training(GLOBAL_BATCH, 4)) < 1e-5
