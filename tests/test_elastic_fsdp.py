"""FSDP2 sharded checkpoints load on another number of processes (issue 24): saved on 2 gloo
processes in torch.distributed.checkpoint's format, loaded on 1 and on 3, the gathered (full) state
dicts equal the saved ones."""

from __future__ import annotations

import pytest
from sharded_helpers import make_model, make_optimizer, max_difference, train_by_index

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


def save_or_load(directory: str, phase: str, version: int = 2):
    """phase "save": 2 steps on 2 processes, then save_state; "load": a model initialised
    differently, load_state. Both return the gathered model state and the optimizer's step count."""
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
    steps = sorted({int(s["step"]) for s in optimizer.state_dict()["state"].values()})
    return full, steps


@pytest.mark.parametrize("version, processes", [(2, 1), (2, 3)])
def test_fsdp_checkpoint_saved_on_two_loads_on_another_number(
    dist_pool, tmp_path, version, processes
):
    directory = str(tmp_path / "ckpt")
    saved = dist_pool(2).run(save_or_load, directory, "save", version)
    loaded = dist_pool(processes).run(save_or_load, directory, "load", version)
    assert saved[0][1] == [2]
    assert max_difference(saved[0][0], loaded[0][0]) == 0
    assert all(steps == [2] for _, steps in loaded)
