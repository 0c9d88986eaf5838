"""Asynchronous saving: CPU snapshot, background write, commit rules kept, errors re-raised."""

from __future__ import annotations

import os

import pytest
import torch

from cadence.checkpointing import (
    AsyncCheckpointSaver,
    begin_checkpoint,
    open_checkpoint,
    verify,
    write_and_commit,
)


def _load(path):
    with open_checkpoint(path) as ckpt:
        weights = ckpt.load_tensors("model.safetensors")
        optim = ckpt.load_object("optimizer.bin")
        ckpt.finish()
    return weights, optim


def _train_state(value: float):
    model = torch.nn.Linear(64, 64)
    with torch.no_grad():
        model.weight.fill_(value)
        model.bias.fill_(value)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.ones(1, 64)).sum().backward()
    optimizer.step()
    return model, optimizer


def test_saved_state_is_the_snapshot_even_when_training_continues(tmp_path):
    model, optimizer = _train_state(1.0)
    expected_weight = model.weight.detach().clone()
    expected_momentum = optimizer.state[model.weight]["momentum_buffer"].clone()
    saver = AsyncCheckpointSaver()
    files = saver.snapshot(
        {"model.safetensors": model.state_dict(), "optimizer.bin": optimizer.state_dict()}
    )
    saver.submit(write_and_commit, begin_checkpoint(tmp_path / "c"), files, commit=True)
    with torch.no_grad():  # training goes on and changes the live tensors in place
        model.weight.add_(100.0)
        optimizer.state[model.weight]["momentum_buffer"].mul_(-1)
    saver.wait()
    verify(tmp_path / "c", "full")
    weights, optim = _load(tmp_path / "c")
    assert torch.equal(weights["weight"], expected_weight)
    assert torch.equal(optim["state"][0]["momentum_buffer"], expected_momentum)
    assert os.listdir(tmp_path) == ["c"]


def test_consecutive_saves_reuse_buffers_without_mixing_states(tmp_path):
    saver = AsyncCheckpointSaver()
    for i in range(3):
        model, optimizer = _train_state(float(i))
        saver.wait()
        files = saver.snapshot(
            {"model.safetensors": model.state_dict(), "optimizer.bin": optimizer.state_dict()}
        )
        saver.submit(write_and_commit, begin_checkpoint(tmp_path / f"c{i}"), files, commit=True)
    saver.wait()
    for i in range(3):
        model, _ = _train_state(float(i))
        weights, _ = _load(tmp_path / f"c{i}")
        assert torch.equal(weights["weight"], model.weight.detach())


def test_snapshot_keeps_shared_tensors_shared():
    shared = torch.randn(4)
    snap = AsyncCheckpointSaver().snapshot({"a": shared, "b": shared, "n": [1, "x"]})
    assert snap["a"] is snap["b"] and snap["a"] is not shared
    assert torch.equal(snap["a"], shared) and snap["n"] == [1, "x"]


def test_background_error_is_raised_at_the_next_wait_and_nothing_is_committed(tmp_path):
    saver = AsyncCheckpointSaver()
    good = {"model.safetensors": {"w": torch.ones(3)}}
    saver.submit(write_and_commit, begin_checkpoint(tmp_path / "ok"), good, commit=True)
    saver.wait()
    bad = {"meta.json": {"step": 1}, "model.safetensors": {"w": "not a tensor"}}
    saver.submit(write_and_commit, begin_checkpoint(tmp_path / "ok"), bad, commit=True)
    with pytest.raises(TypeError, match="dict of str -> torch.Tensor"):
        saver.wait()
    saver.wait()  # the error is reported once
    # The previous checkpoint is untouched and the temporary folder is gone.
    assert os.listdir(tmp_path) == ["ok"]
    weights = open_checkpoint(tmp_path / "ok").load_tensors("model.safetensors")
    assert torch.equal(weights["w"], torch.ones(3))


def test_submit_waits_for_the_previous_save(tmp_path):
    saver = AsyncCheckpointSaver()
    order = []

    def slow(tag):
        import time

        time.sleep(0.2)
        order.append(tag)

    saver.submit(slow, "first")
    saver.submit(slow, "second")
    assert order == ["first"]
    saver.wait()
    assert order == ["first", "second"]
    assert not saver.in_progress


def test_deferred_copy_is_taken_before_the_fence_returns(tmp_path):
    model, optimizer = _train_state(2.0)
    expected = model.weight.detach().clone()
    saver = AsyncCheckpointSaver()
    live = {"model.safetensors": model.state_dict(), "optimizer.bin": optimizer.state_dict()}
    saver.submit_deferred(live, write_and_commit, begin_checkpoint(tmp_path / "c"), commit=True)
    saver.fence()  # what the training loop does before optimizer.step()
    with torch.no_grad():
        model.weight.mul_(-3.0)
    saver.wait()
    weights, _ = _load(tmp_path / "c")
    assert torch.equal(weights["weight"], expected)
    saver.fence()  # nothing running: returns at once


def test_deferred_copy_error_releases_the_fence_and_is_raised_at_wait(tmp_path):
    saver = AsyncCheckpointSaver()

    class Uncopyable:
        def __deepcopy__(self, memo):
            raise RuntimeError("cannot copy this")

    live = {"meta.bin": {"obj": Uncopyable()}}
    saver.submit_deferred(live, write_and_commit, begin_checkpoint(tmp_path / "c"), commit=True)
    saver.fence()
    with pytest.raises(RuntimeError, match="cannot copy this"):
        saver.wait()
    assert os.listdir(tmp_path) == []  # the temporary folder of the failed save is gone
