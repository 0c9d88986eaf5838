"""FSDP sharded checkpoints load on another number of processes (issue 24): saved on 2 gloo
processes in torch.distributed.checkpoint's format, loaded on 1 and on 3, the gathered (full) model
and optimizer state dicts equal the saved ones. On 3 processes FSDP1's flat shards leave some
parameters with no part at all on the last rank (the case torch's default load planner mistook for an
old checkpoint)."""

from __future__ import annotations

import pytest
from sharded_helpers import (
    make_model,
    make_optimizer,
    max_difference,
    needs_fsdp2_on_cpu,
    train_by_index,
)

from cadence.core import torch_compat

GLOBAL_BATCH = 16


def _accelerator(version: int):
    from cadence import Accelerator
    from cadence.plugins import FullyShardedDataParallelPlugin

    plugin = FullyShardedDataParallelPlugin(
        fsdp_version=version,
        auto_wrap_policy="transformer_based_wrap",
        transformer_cls_names_to_wrap=["Block"],
        state_dict_type="SHARDED_STATE_DICT",
    )
    return Accelerator(fsdp_plugin=plugin)


def _full_optimizer_state(model, optimizer) -> dict:
    """The optimizer's whole state, gathered on every rank: {"<param>.<moment>": tensor}."""
    import torch
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

    while hasattr(optimizer, "optimizer"):  # the prepared wrapper
        optimizer = optimizer.optimizer
    # No CPU offload: FSDP1 on CPU cannot gather with it (see cadence/strategies/fsdp1.py).
    options = StateDictOptions(full_state_dict=True, cpu_offload=False)
    state = get_optimizer_state_dict(model, optimizer, options=options)["state"]
    return {
        f"{name}.{moment}": torch.as_tensor(value).detach().clone()
        for name, moments in state.items()
        for moment, value in moments.items()
    }


def save_or_load(directory: str, phase: str, version: int = 2):
    """phase "save": 2 steps on 2 processes, then save_state; "load": a model initialised
    differently, load_state. Both return the gathered model and optimizer states."""
    acc = _accelerator(version)
    model = make_model(seed=0 if phase == "save" else 42)
    optimizer = make_optimizer(model)
    model, optimizer = acc.prepare(model, optimizer)
    if phase == "save":
        train_by_index(acc, model, optimizer, GLOBAL_BATCH, 0, 2, acc.process_index, 2)
        acc.save_state(directory)
    else:
        acc.load_state(directory)
    full = {k: v.detach().clone() for k, v in acc.get_state_dict(model).items()}
    return full, _full_optimizer_state(model, optimizer)


def load_expecting_torch_refusal(directory: str, version: int) -> str:
    """Load on a torch release that cannot: the refusal's text on this rank."""
    try:
        save_or_load(directory, "load", version)
    except torch_compat.TorchVersionError as error:
        return str(error)
    return "loaded"


@pytest.mark.parametrize(
    "version, processes",
    [
        pytest.param(2, 1, marks=needs_fsdp2_on_cpu),
        pytest.param(2, 3, marks=needs_fsdp2_on_cpu),
        (1, 1),
        (1, 3),
    ],
    ids=["fsdp2-1", "fsdp2-3", "fsdp1-1", "fsdp1-3"],
)
def test_fsdp_checkpoint_saved_on_two_loads_on_another_number(
    dist_pool, tmp_path, version, processes
):
    directory = str(tmp_path / "ckpt")
    saved = dist_pool(2).run(save_or_load, directory, "save", version)
    if (
        version == 1
        and processes == 3
        and not torch_compat.torch_at_least(torch_compat.FSDP1_UNEVEN_SHARDED_STATE)
    ):
        # torch 2.7 cannot build the sharded state dict where a rank holds no part of a
        # parameter: every rank refuses (none waits for the one torch fails on), naming the fix.
        for rank, outcome in enumerate(
            dist_pool(3).run(load_expecting_torch_refusal, directory, 1)
        ):
            assert outcome.startswith(f"[rank {rank}] An FSDP1 SHARDED_STATE_DICT on 3 processes")
            assert "pip install 'torch>=" in outcome and "FULL_STATE_DICT" in outcome
        return
    loaded = dist_pool(processes).run(save_or_load, directory, "load", version)
    model, optimizer = saved[0]
    assert {float(v) for k, v in optimizer.items() if k.endswith(".step")} == {2.0}
    assert any(v.abs().max() > 0 for k, v in optimizer.items() if k.endswith(".exp_avg"))
    assert max_difference(model, loaded[0][0]) == 0
    for rank, (_, loaded_optimizer) in enumerate(loaded):
        assert max_difference(optimizer, loaded_optimizer) == 0, f"rank {rank}"


def _full_model_state(model) -> dict:
    """The model's whole state, gathered on every rank."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    options = StateDictOptions(full_state_dict=True, cpu_offload=False)
    return {k: v.detach().clone() for k, v in get_model_state_dict(model, options=options).items()}


def load_expecting_refusal(directory: str, version: int = 2):
    """Load a damaged checkpoint into a model initialised differently: returns the error each rank
    got and how far the model and optimizer moved (they must not)."""
    from cadence.checkpointing import CheckpointError

    acc = _accelerator(version)
    model = make_model(seed=42)
    optimizer = make_optimizer(model)
    model, optimizer = acc.prepare(model, optimizer)
    before = _full_model_state(model)
    moments = _full_optimizer_state(model, optimizer)
    error = None
    try:
        acc.load_state(directory)
    except CheckpointError as e:
        error = (type(e).__name__, str(e))
    after = _full_model_state(model)
    now = _full_optimizer_state(model, optimizer)
    same = sorted(now) == sorted(moments) and all(now[k].equal(moments[k]) for k in now)
    return error, max_difference(before, after), same


@needs_fsdp2_on_cpu
@pytest.mark.parametrize("damaged", ["__0_0.distcp", ".metadata"])
def test_a_damaged_shard_file_is_refused_on_every_rank_before_anything_changes(
    dist_pool, tmp_path, damaged
):
    """torch.distributed.checkpoint reads FSDP's shard files itself (and unpickles `.metadata`):
    they are checked against the manifest first, so one flipped byte (same size) is refused on
    every rank, whichever rank would have read the file, and nothing is loaded."""
    directory = tmp_path / "ckpt"
    dist_pool(2).run(save_or_load, str(directory), "save", 2)
    target = directory / "pytorch_model_fsdp_0" / damaged
    data = bytearray(target.read_bytes())
    data[len(data) // 2] ^= 0xFF
    target.write_bytes(bytes(data))
    results = dist_pool(2).run(load_expecting_refusal, str(directory))
    for rank, (error, moved, optimizer_same) in enumerate(results):
        assert error is not None, f"rank {rank} loaded a damaged checkpoint"
        kind, message = error
        assert kind == "CheckpointCorruptError" and f"pytorch_model_fsdp_0/{damaged}" in message
        assert "nothing of it was applied" in message
        assert moved == 0 and optimizer_same, f"rank {rank}: state changed"
