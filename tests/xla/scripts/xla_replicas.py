"""Started by `cadence launch --tpu` on a real TPU VM (one process per chip): collectives between XLA
replicas and data-parallel training against eager CPU on the same global batch. Each replica prints one
JSON report. torch_xla's CPU device cannot run several replicas, so this needs a TPU."""

from __future__ import annotations

import os
import sys

import torch

sys.path.insert(0, os.path.dirname(__file__))
from xla_common import BATCH, CLIP, LR, dataset, eager_cpu_training, fresh_model, max_diff, report  # noqa: E402


def main() -> None:
    from cadence import Accelerator
    from cadence.utils import broadcast, broadcast_object_list, gather_object, reduce

    accelerator = Accelerator()
    n, rank, device = accelerator.num_processes, accelerator.process_index, accelerator.device
    t = torch.tensor([float(rank)], device=device)
    results = {
        "rank": rank,
        "num_processes": n,
        "distributed_type": accelerator.distributed_type.value,
        "gather": accelerator.gather(t).cpu().tolist(),
        "gather_0d": accelerator.gather(t[0]).cpu().tolist(),
        "reduce_sum_scale": accelerator.reduce(t, "sum", scale=0.5).cpu().tolist(),
        "reduce_mean": reduce(t, "mean").cpu().tolist(),
        "reduce_max": reduce(t, "max").cpu().tolist(),
        "broadcast": broadcast(t.clone(), from_process=n - 1).cpu().tolist(),
        "gather_object": gather_object([{"rank": rank}]),
        "broadcast_object_list": broadcast_object_list([f"from {rank}"], from_process=0),
        "pad_shape": list(
            accelerator.pad_across_processes(torch.ones(rank + 1, device=device), dim=0).shape
        ),
    }
    accelerator.wait_for_everyone()
    model = fresh_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)
    loader = torch.utils.data.DataLoader(dataset(), batch_size=BATCH)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    for x, y in loader:
        accelerator.backward(torch.nn.functional.mse_loss(model(x), y))
        accelerator.clip_grad_norm_(model.parameters(), CLIP)
        optimizer.step()
        optimizer.zero_grad()
    trained = accelerator.get_state_dict(model)
    expected, _ = eager_cpu_training(batch_size=BATCH * n, accumulation=1)
    results["weights_max_abs_diff"] = max_diff(trained, expected)
    report(results)


if __name__ == "__main__":
    raise SystemExit("run me through `cadence launch --tpu`")
