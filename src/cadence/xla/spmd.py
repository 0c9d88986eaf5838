"""Which SPMD layout a training on XLA asks for, read from the configuration it already has: an FSDP
plugin or `ParallelismConfig(dp_shard_size=N)` means FSDPv2 (parameters sharded over an "fsdp" mesh
axis), `ParallelismConfig(dp_replicate_size=N)` data parallelism (batches split over a "data" axis), both
together a 2-d mesh. Checked before anything starts (the process state calls it before switching
torch_xla to SPMD); the XLA strategy builds the mesh from the same plan.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class SpmdPlan:
    """How a single process drives several XLA devices: `mode` is "dp" (batch sharding) or "fsdp"
    (FSDPv2); `axes` names the mesh dimensions, `shape` their sizes."""

    mode: str
    axes: tuple[str, ...]
    shape: tuple[int, ...]


def spmd_plan(
    fsdp_plugin: Any,
    parallelism_config: Any,
    num_processes: int,
    device_count: Callable[[], int],
) -> SpmdPlan | None:
    """The SPMD layout asked for, or None (no plugin, no config: one device per process). Raises for
    what XLA cannot do; `device_count()` is asked only when a layout is asked for.

    Example::

        spmd_plan(None, ParallelismConfig(dp_replicate_size=4), 1, lambda: 4)
        # SpmdPlan(mode='dp', axes=('data',), shape=(4,))
    """
    config = parallelism_config
    fsdp = fsdp_plugin is not None
    if config is None and not fsdp:
        return None
    if config is not None and (config.tp_size > 1 or config.cp_size > 1 or config.sp_size > 1):
        raise NotImplementedError(
            "On XLA, Cadence supports data parallelism (dp_replicate_size) and FSDPv2 (dp_shard_size or an "
            "FSDP plugin) through SPMD; tensor, context and sequence parallelism are not supported. "
            "Set tp_size, cp_size and sp_size to 1."
        )
    if num_processes > 1:
        raise ValueError(
            f"SPMD on XLA drives every device from one process, but {num_processes} XLA processes were "
            "started: launch one process per host (`cadence launch --tpu --num_processes 1`), or drop the "
            "FSDP plugin / ParallelismConfig to train one replica per process."
        )
    count = device_count()
    replicate = config.dp_replicate_size if config is not None else 1
    shard = config.dp_shard_size if config is not None else 1
    if config is None or replicate * shard == 1:
        replicate, shard = (1, count) if fsdp else (count, 1)
    if replicate * shard != count:
        raise ValueError(
            f"The ParallelismConfig asks for dp_replicate_size {replicate} x dp_shard_size {shard} = "
            f"{replicate * shard} XLA devices, but this host has {count} (CPU_NUM_DEVICES on torch_xla's "
            "CPU device). Make the product equal the device count."
        )
    if fsdp or shard > 1:
        if replicate > 1:
            return SpmdPlan("fsdp", ("data", "fsdp"), (replicate, shard))
        return SpmdPlan("fsdp", ("fsdp",), (shard,))
    return SpmdPlan("dp", ("data",), (replicate,))
