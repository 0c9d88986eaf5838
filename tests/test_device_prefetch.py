"""How the prepared loader moves batches: pinned memory and side-stream prefetch only for CUDA, the
plain move everywhere else (CPU here; the CUDA side is in test_cuda.py)."""

from __future__ import annotations

import torch
from torch.utils.data import DataLoader, TensorDataset

from cadence.data.device_prefetch import batch_transfer, pin_memory_kwargs


def test_pinned_memory_is_asked_for_cuda_batches_only():
    kwargs = {"batch_size": 4, "pin_memory": False}
    assert pin_memory_kwargs(kwargs, "cuda")["pin_memory"] is True
    assert pin_memory_kwargs(kwargs, torch.device("cuda", 1))["pin_memory"] is True
    assert pin_memory_kwargs(kwargs, "cuda") is not kwargs and kwargs["pin_memory"] is False
    assert pin_memory_kwargs(kwargs, "cpu") is kwargs
    assert pin_memory_kwargs(kwargs, None) is kwargs
    pinned = {"pin_memory": True}
    assert pin_memory_kwargs(pinned, "cuda") is pinned


def test_off_cuda_a_batch_moves_as_before():
    batch = {"x": torch.ones(2), "y": [torch.zeros(1), "label"]}
    same = batch_transfer(batch, "cpu", non_blocking=False)
    assert same.finish(same.start(batch)) is batch  # already on the CPU: untouched
    nowhere = batch_transfer(batch, None, non_blocking=False)
    assert nowhere.finish(nowhere.start(batch)) is batch
    meta = batch_transfer(batch, "meta", non_blocking=False)
    moved = meta.finish(meta.start(batch))
    assert moved["x"].device.type == "meta" and moved["y"][1] == "label"


def test_the_prepared_cpu_loader_keeps_every_batch_in_order_and_unpinned():
    from cadence import Accelerator

    accelerator = Accelerator(cpu=True)
    data = TensorDataset(torch.arange(20.0).reshape(10, 2), torch.arange(10))
    loader = accelerator.prepare(DataLoader(data, batch_size=3))
    assert not loader.pin_memory
    batches = list(loader)
    assert [len(y) for _, y in batches] == [3, 3, 3, 1]
    assert torch.equal(torch.cat([x for x, _ in batches]), data.tensors[0])
