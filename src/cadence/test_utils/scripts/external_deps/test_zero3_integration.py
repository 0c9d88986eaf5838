"""DeepSpeed ZeRO-3 on the launched processes: parameters are partitioned after prepare, a
training step runs, and `GatheredParameters` gives each process the whole weights inside its
block. Needs DeepSpeed."""

from __future__ import annotations

import sys

import torch

from cadence.core.availability import is_deepspeed_available
from cadence.test_utils.scripts._checks import check


def main() -> None:
    """Run every check of this script on this process; the first failure raises."""
    if not is_deepspeed_available():
        sys.exit("test_zero3_integration needs DeepSpeed: pip install deepspeed")
    from cadence import Accelerator, DeepSpeedPlugin
    from cadence.utils import DistributedType
    from cadence.utils.operations import GatheredParameters

    plugin = DeepSpeedPlugin(zero_stage=3, gradient_clipping=0.0, zero3_save_16bit_model=True)
    accelerator = Accelerator(deepspeed_plugin=plugin)
    check(
        accelerator.distributed_type == DistributedType.DEEPSPEED,
        f"distributed type {accelerator.distributed_type}",
    )
    torch.manual_seed(0)
    model = torch.nn.Linear(16, 4)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    data = torch.utils.data.TensorDataset(torch.randn(8 * accelerator.num_processes, 16))
    loader = torch.utils.data.DataLoader(data, batch_size=4)
    engine, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    weight = engine.module.weight
    check(hasattr(weight, "ds_id"), "ZeRO-3 did not partition the parameters")
    for (x,) in loader:
        accelerator.backward(engine(x).pow(2).mean())
        optimizer.step()
        optimizer.zero_grad()
    with GatheredParameters([weight]):
        check(tuple(weight.shape) == (4, 16), f"gathered weight shape {tuple(weight.shape)}")
    if accelerator.is_main_process:
        print("ZeRO-3 integration checks passed.")


if __name__ == "__main__":
    main()
