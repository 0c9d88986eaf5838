"""Safe serialization: safetensors for weights, weights_only loading, explicit pickle opt-in."""

from __future__ import annotations

import os
import random
from collections import OrderedDict

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from cadence.checkpointing import (
    CheckpointCorruptError,
    UnsafeCheckpointError,
    apply_model_state,
    begin_checkpoint,
    capture_rng_state,
    dedupe_shared_tensors,
    load,
    open_checkpoint,
    read_torch,
    restore_rng_state,
    save,
)


class Opaque:
    """A class only unpickling can rebuild."""

    def __init__(self, value):
        self.value = value


class TiedModel(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(10, 4)
        self.body = torch.nn.Linear(4, 4)
        self.head = torch.nn.Linear(4, 10, bias=False)
        self.head.weight = self.embed.weight


def test_pickle_bearing_file_is_refused_without_opt_in(tmp_path):
    path = tmp_path / "custom_checkpoint_0.pkl"
    torch.save({"obj": Opaque(3)}, path)
    with pytest.raises(UnsafeCheckpointError) as info:
        read_torch(path)
    message = str(info.value)
    assert str(path) in message
    assert "allow_pickle=True" in message and "weights_only" in message
    assert "Opaque" in message
    assert read_torch(path, allow_pickle=True)["obj"].value == 3
    assert read_torch(path, weights_only=False)["obj"].value == 3


def test_pickle_refusal_through_the_checkpoint_reader(tmp_path):
    writer = begin_checkpoint(tmp_path / "c")
    writer.save_object("custom_checkpoint_0.pkl", {"obj": Opaque(5)})
    writer.commit()
    with open_checkpoint(tmp_path / "c") as ckpt:
        with pytest.raises(UnsafeCheckpointError, match="custom_checkpoint_0.pkl"):
            ckpt.load_object("custom_checkpoint_0.pkl")
        assert ckpt.load_object("custom_checkpoint_0.pkl", allow_pickle=True)["obj"].value == 5
        ckpt.finish()


def test_plain_state_and_numpy_arrays_load_without_opt_in(tmp_path):
    state = {
        "step": 3,
        "lr": [0.1, 0.01],
        "name": "adam",
        "t": torch.arange(4),
        "np": np.arange(5, dtype=np.int32),
        "nested": OrderedDict(a=(1, 2.5, None, True)),
    }
    save(state, tmp_path / "s.bin")
    loaded = read_torch(tmp_path / "s.bin")
    assert loaded["step"] == 3 and loaded["lr"] == [0.1, 0.01] and loaded["name"] == "adam"
    assert torch.equal(loaded["t"], torch.arange(4))
    assert np.array_equal(loaded["np"], np.arange(5, dtype=np.int32))
    assert loaded["nested"] == OrderedDict(a=(1, 2.5, None, True))


def test_unreadable_file_is_reported_as_corrupt(tmp_path):
    path = tmp_path / "bad.bin"
    path.write_bytes(b"PK\x03\x04 definitely not a torch file" * 4)
    with pytest.raises(CheckpointCorruptError, match="bad.bin"):
        read_torch(path)
    bad_st = tmp_path / "bad.safetensors"
    bad_st.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not a header}")
    with pytest.raises(CheckpointCorruptError, match="bad.safetensors"):
        load(bad_st)


def test_rng_state_round_trip_is_exact_and_pickle_free(tmp_path):
    random.seed(1)
    np.random.seed(2)
    torch.manual_seed(3)
    random.random(), np.random.rand(), torch.rand(1)  # move away from the seeded start
    np.random.randn()  # leaves a cached gaussian in numpy's state
    writer = begin_checkpoint(tmp_path / "c")
    writer.save_object("random_states_0.pkl", capture_rng_state(step=11))
    writer.commit()
    expected = (random.random(), np.random.rand(), np.random.randn(), torch.rand(3))

    random.seed(100)
    np.random.seed(100)
    torch.manual_seed(100)
    with open_checkpoint(tmp_path / "c") as ckpt:
        state = ckpt.load_object("random_states_0.pkl")  # weights_only: no unpickling
        ckpt.finish()
    assert state["step"] == 11
    restore_rng_state(state)
    got = (random.random(), np.random.rand(), np.random.randn(), torch.rand(3))
    assert got[:3] == expected[:3]
    assert torch.equal(got[3], expected[3])


def test_save_safetensors_is_atomic_and_dedupes_tied_weights(tmp_path):
    model = TiedModel()
    path = tmp_path / "model.safetensors"
    save(model.state_dict(), path, safe_serialization=True)
    assert os.listdir(tmp_path) == ["model.safetensors"]
    stored = load_file(path)
    # The first name of a tied pair is kept, like the reference.
    assert "embed.weight" in stored and "head.weight" not in stored
    fresh = TiedModel()
    apply_model_state(fresh, stored, strict=True)
    assert torch.equal(fresh.head.weight, model.embed.weight)
    assert fresh.head.weight is fresh.embed.weight


def test_save_to_a_file_object_and_bad_input(tmp_path):
    with open(tmp_path / "x.bin", "wb") as f:
        save({"a": torch.ones(2)}, f)
    assert torch.equal(load(tmp_path / "x.bin")["a"], torch.ones(2))
    with pytest.raises(TypeError, match="dict of str -> torch.Tensor"):
        save({"a": 1}, tmp_path / "y.safetensors", safe_serialization=True)
    assert not (tmp_path / "y.safetensors").exists()


def test_dedupe_drops_exact_aliases_and_copies_partial_views():
    base = torch.arange(12.0)
    state = {"whole": base, "alias": base, "first_half": base[:6], "second_half": base[6:]}
    clean, removed = dedupe_shared_tensors(state)
    assert removed == {"alias": "whole"}
    assert list(clean) == ["whole", "first_half", "second_half"]
    assert torch.equal(clean["first_half"], torch.arange(6.0))
    assert torch.equal(clean["second_half"], torch.arange(6.0, 12.0))
    assert clean["second_half"].untyped_storage().data_ptr() != base.untyped_storage().data_ptr()


def test_views_of_one_buffer_survive_a_safetensors_round_trip(tmp_path):
    flat = torch.randn(10)
    state = {"a": flat[:4], "b": flat[4:].view(2, 3)}
    save(state, tmp_path / "v.safetensors", safe_serialization=True)
    loaded = load(tmp_path / "v.safetensors")
    assert torch.equal(loaded["a"], flat[:4]) and torch.equal(loaded["b"], flat[4:].view(2, 3))
