"""Checkpoints written by 2 real gloo processes into one folder, synchronously and asynchronously.

The storage layer makes no collective call; these functions play the Accelerator's part
(broadcast of the token, barriers) with plain torch.distributed.
"""

from __future__ import annotations

import os


def _shared_token() -> str:
    import torch.distributed as dist

    from cadence.checkpointing import new_token

    box = [new_token() if dist.get_rank() == 0 else None]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def _rank_state(rank: int, step: int):
    import torch

    return {"rank": rank, "step": step, "noise": torch.full((8,), float(rank * 100 + step))}


def save_sync_then_load(folder: str):
    import torch
    import torch.distributed as dist

    from cadence.checkpointing import begin_checkpoint, open_checkpoint

    rank, world = dist.get_rank(), dist.get_world_size()
    writer = begin_checkpoint(folder, token=_shared_token(), rank=rank)
    if rank == 0:
        writer.save_tensors("model.safetensors", {"w": torch.arange(6.0)})
    writer.save_object(f"random_states_{rank}.pkl", _rank_state(rank, 5))
    writer.rank_done()
    dist.barrier()
    if rank == 0:
        writer.commit(world_size=world, metadata={"step": 5})
    dist.barrier()
    with open_checkpoint(folder) as ckpt:
        own = ckpt.load_object(f"random_states_{rank}.pkl")
        weights = ckpt.load_tensors("model.safetensors")
        ckpt.finish()
        return {
            "files": ckpt.names(),
            "world_size": ckpt.manifest.world_size,
            "own_rank": own["rank"],
            "noise": own["noise"].tolist(),
            "w": weights["w"].tolist(),
        }


def test_two_processes_commit_one_checkpoint(dist_pool, tmp_path):
    folder = str(tmp_path / "ckpt")
    results = dist_pool(2).run(save_sync_then_load, folder)
    for rank, result in enumerate(results):
        assert result["files"] == [
            "model.safetensors",
            "random_states_0.pkl",
            "random_states_1.pkl",
        ]
        assert result["world_size"] == 2
        assert result["own_rank"] == rank
        assert result["noise"] == [float(rank * 100 + 5)] * 8
        assert result["w"] == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]
    assert os.listdir(tmp_path) == ["ckpt"]


def save_async_while_training(project: str, saves: int):
    import torch
    import torch.distributed as dist

    from cadence.checkpointing import (
        AsyncCheckpointSaver,
        automatic_checkpoint_dir,
        begin_checkpoint,
        checkpoints_dir,
        latest_checkpoint,
        open_checkpoint,
        prune_checkpoints,
        write_and_commit,
    )

    rank, world = dist.get_rank(), dist.get_world_size()
    saver = AsyncCheckpointSaver()
    weights = torch.zeros(1000)
    for step in range(saves):
        weights += 1  # one "training step"
        saver.wait()  # the next save waits for the previous one
        token = _shared_token()
        files = {f"random_states_{rank}.pkl": _rank_state(rank, step)}
        if rank == 0:
            files["model.safetensors"] = {"w": weights}
        files = saver.snapshot(files)
        writer = begin_checkpoint(automatic_checkpoint_dir(project, step), token=token, rank=rank)
        saver.submit(
            write_and_commit,
            writer,
            files,
            commit=rank == 0,
            world_size=world,
            timeout=60,
            metadata={"step": step},
            after_commit=lambda: prune_checkpoints(checkpoints_dir(project), total_limit=2),
        )
    saver.wait()  # end of training
    dist.barrier()
    latest = latest_checkpoint(checkpoints_dir(project))
    with open_checkpoint(latest) as ckpt:
        own = ckpt.load_object(f"random_states_{rank}.pkl")
        w = ckpt.load_tensors("model.safetensors")["w"]
        ckpt.finish()
    return {
        "latest": latest.name,
        "all": sorted(os.listdir(checkpoints_dir(project))),
        "step": own["step"],
        "w": float(w[0]),
    }


def test_two_processes_save_asynchronously_with_rotation(dist_pool, tmp_path):
    results = dist_pool(2).run(save_async_while_training, str(tmp_path), 4)
    for result in results:
        assert result["latest"] == "checkpoint_3"
        assert result["all"] == ["checkpoint_2", "checkpoint_3"]
        assert result["step"] == 3
        assert result["w"] == 4.0  # the snapshot of the 4th step
