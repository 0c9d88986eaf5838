"""FSDP2's sharded state on its way to a healing group: each DTensor travels as its local shard.

torchft's PGTransport can send a DTensor, but it pickles the DTensor's spec, whose DeviceMesh names
the sender's process groups; in the receiving process those names resolve to whatever groups of
its own carry them, right only by coincidence. So a shard travels as a plain tensor with its layout
(placements, global shape and stride), and the receiver rebuilds it on its own mesh. The layouts
agree: rank r of the healing group receives from rank r of its peer (torchft's process group per
group rank), and every group runs the same number of processes (the session checks it).
"""

from __future__ import annotations

from typing import Any

import torch

_SHARD = "cadence_local_shard"  # the key that marks a shard in the state sent


def local_shards(tree: Any) -> Any:
    """`tree` (nested dicts, lists, tuples) with every DTensor replaced by its local shard and
    layout; everything else as it is."""
    from torch.distributed.tensor import DTensor

    if isinstance(tree, DTensor):
        return {
            _SHARD: tree.to_local(),
            "placements": list(tree.placements),
            "shape": list(tree.shape),
            "stride": list(tree.stride()),
        }
    if isinstance(tree, dict):
        return {key: local_shards(value) for key, value in tree.items()}
    if isinstance(tree, (list, tuple)):
        return type(tree)(local_shards(value) for value in tree)
    return tree


def rebuild_shards(tree: Any, mesh: Any) -> Any:
    """`tree` as `local_shards` made it, each shard a DTensor again on `mesh` (this process's);
    a tree without shards comes back as it is.

    Raises:
        RuntimeError: a shard arrived but this process holds no sharded parameter (its mesh is
            None): the peer trains with FSDP2 and this group does not.
    """
    if isinstance(tree, dict) and _SHARD in tree:
        if mesh is None:
            raise RuntimeError(
                "a healing group received FSDP2 shards from its peer but trains without FSDP2: "
                "every replica group of a job must use the same parallelism"
            )
        from torch.distributed.tensor import DTensor

        return DTensor.from_local(
            tree[_SHARD],
            mesh,
            tree["placements"],
            run_check=False,
            shape=torch.Size(tree["shape"]),
            stride=tuple(tree["stride"]),
        )
    if isinstance(tree, dict):
        return {key: rebuild_shards(value, mesh) for key, value in tree.items()}
    if isinstance(tree, (list, tuple)):
        return type(tree)(rebuild_shards(value, mesh) for value in tree)
    return tree


def shard_mesh(parameters: Any) -> Any:
    """The device mesh the first sharded parameter of `parameters` lives on (Cadence's FSDP2
    shards every parameter of a model over the one mesh of its group), or None when none is."""
    from torch.distributed.tensor import DTensor

    for parameter in parameters:
        if isinstance(parameter, DTensor):
            return parameter.device_mesh
    return None
