"""Several XLA devices in one process through SPMD (CPU_NUM_DEVICES=4 on torch_xla's CPU device):
batch-sharded data parallelism from ParallelismConfig(dp_replicate_size=4), FSDPv2 from an FSDP plugin
and from ParallelismConfig(dp_shard_size=4); each ends with the weights of eager CPU training on the same
global batch. Prints one JSON report."""

from __future__ import annotations

import os
import sys
import tempfile

import torch

sys.path.insert(0, os.path.dirname(__file__))
from xla_common import BATCH, CLIP, LR, dataset, eager_cpu_training, fresh_model, max_diff, report  # noqa: E402

from cadence import Accelerator  # noqa: E402
from cadence.state import PartialState, reset_state  # noqa: E402
from cadence.utils import FullyShardedDataParallelPlugin, ParallelismConfig  # noqa: E402

results: dict = {}
trained: dict = {}


def scenario(name: str, **kwargs) -> None:
    reset_state()
    accelerator = Accelerator(**kwargs)
    model = fresh_model()
    loader = torch.utils.data.DataLoader(dataset(), batch_size=BATCH)
    model = accelerator.prepare(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)
    optimizer, loader = accelerator.prepare(optimizer, loader)
    import torch_xla

    losses = []
    shardings = set()
    for x, y in loader:
        shardings.add(torch_xla._XLAC._get_xla_sharding_spec(x))
        loss = torch.nn.functional.mse_loss(model(x), y)
        losses.append(loss)
        accelerator.backward(loss)
        accelerator.clip_grad_norm_(model.parameters(), CLIP)
        optimizer.step()
        optimizer.zero_grad()
    losses = [float(loss.item()) for loss in losses]
    weights = accelerator.get_state_dict(model)
    inner = accelerator.unwrap_model(model)
    param_sharding = torch_xla._XLAC._get_xla_sharding_spec(inner.encode.weight)
    with tempfile.TemporaryDirectory() as folder:
        saved = accelerator.save_state(os.path.join(folder, "ckpt"))
        accelerator.load_state(saved)
        reloaded = accelerator.get_state_dict(model)
    trained[name] = (weights, losses)
    results[name] = {
        "num_processes": accelerator.num_processes,
        "distributed_type": accelerator.distributed_type.value,
        "wrapper": type(model).__name__,
        "unwrapped": type(inner).__name__,
        "batch_shardings": sorted(shardings),
        "param_sharding": param_sharding,
        "mesh_shape": list(accelerator._strategy.mesh.mesh_shape),
        "reload_diff": max_diff(reloaded, weights),
        "steps": len(losses),
    }


scenario("dp", parallelism_config=ParallelismConfig(dp_replicate_size=4))
scenario("fsdp_plugin", fsdp_plugin=FullyShardedDataParallelPlugin())
scenario("fsdp_config", parallelism_config=ParallelismConfig(dp_shard_size=4))
scenario("hsdp", parallelism_config=ParallelismConfig(dp_replicate_size=2, dp_shard_size=2))
errors = {}
for name, kwargs in {
    "wrong_size": {"parallelism_config": ParallelismConfig(dp_replicate_size=3)},
    "tp": {"parallelism_config": ParallelismConfig(tp_size=4)},
}.items():
    reset_state()
    try:
        Accelerator(**kwargs)
        errors[name] = None
    except (ValueError, NotImplementedError) as error:
        errors[name] = f"{type(error).__name__}: {error}"
    errors[f"{name}_left_state"] = PartialState._shared_state != {}  # raised before any side effect
results["errors"] = errors
# Eager CPU training last: a CPU backward before the first XLA backward leaves torch's autograd engine
# without a queue for XLA devices (torch / torch_xla behaviour, explained by Cadence's error).
expected, cpu_losses = eager_cpu_training(accumulation=1)
for name, (weights, losses) in trained.items():
    results[name]["loss_max_abs_diff"] = max(abs(a - b) for a, b in zip(losses, cpu_losses))
    results[name]["weights_max_abs_diff"] = max_diff(weights, expected)
report(results)
