"""A save_state before the first optimizer step changes nothing, under FSDP2 (sharded and full state
dicts) and tensor parallelism, on 2 real gloo processes.

torch's `get_optimizer_state_dict` gives an optimizer that has not stepped yet a state by calling its
`step()` with zero gradients and a zero learning rate; for AdamW that counts as a step, so without
care the saving run's next step would use the bias correction of step 2 instead of 1, and a run
resumed from that checkpoint would too. Both must train exactly as a run that never saved.
"""

from __future__ import annotations

import pytest
from sharded_helpers import (
    make_model,
    make_optimizer,
    max_difference,
    needs_fsdp2_on_cpu,
    reference_training,
    train_by_index,
)

GLOBAL_BATCH = 16
STEPS = 3


def _accelerator(layout: str):
    from cadence import Accelerator
    from cadence.plugins import FullyShardedDataParallelPlugin, ParallelismConfig

    if layout == "tp":
        return Accelerator(parallelism_config=ParallelismConfig(tp_size=2))
    plugin = FullyShardedDataParallelPlugin(
        fsdp_version=2,
        state_dict_type=layout,
        auto_wrap_policy="transformer_based_wrap",
        transformer_cls_names_to_wrap=["Block"],
    )
    return Accelerator(fsdp_plugin=plugin)


def three_runs(folder: str, layout: str):
    """The same STEPS AdamW steps three times: never saving; after a save_state before the first step;
    and from a differently initialised model that loads that checkpoint. Returns the gathered weights
    of each (on the main process; TP gathers on every rank) and the steps the checkpoint recorded."""
    import torch.distributed as dist

    from cadence.state import reset_state

    results = []
    for run in ("straight", "saved", "resumed"):
        reset_state()
        dist.barrier()
        acc = _accelerator(layout)
        # TP: both ranks are one data-parallel rank and read the whole batch.
        dp_rank, dp_size = (0, 1) if layout == "tp" else (acc.process_index, acc.num_processes)
        model = make_model(seed=42 if run == "resumed" else 0)
        optimizer = make_optimizer(model)
        model, optimizer = acc.prepare(model, optimizer)
        if run == "saved":
            acc.save_state(folder)
        elif run == "resumed":
            acc.load_state(folder)
        train_by_index(acc, model, optimizer, GLOBAL_BATCH, 0, STEPS, dp_rank, dp_size)
        results.append(acc.get_state_dict(model))
    return results


@needs_fsdp2_on_cpu
@pytest.mark.parametrize("layout", ["SHARDED_STATE_DICT", "FULL_STATE_DICT", "tp"])
def test_a_save_before_the_first_step_changes_no_adamw_step(dist_pool, tmp_path, layout):
    straight, saved, resumed = dist_pool(2).run(
        three_runs, str(tmp_path / "ckpt"), layout, timeout=180
    )[0]
    # Same processes, same order of operations: bit-identical, not merely close.
    assert max_difference(saved, straight) == 0
    assert max_difference(resumed, straight) == 0
    assert max_difference(straight, reference_training(GLOBAL_BATCH, STEPS)) < 1e-5
