"""save_model sharding (files, index, tied weights) and load_checkpoint_in_model."""

from __future__ import annotations

import json
import os

import pytest
import torch
from safetensors.torch import load_file

from cadence.checkpointing import load_checkpoint_in_model, parse_shard_size, save_model


class Flat(torch.nn.Module):
    """Parameters a..e of 100, 100, 300, 50, 50 float32 values (400, 400, 1200, 200, 200 bytes)."""

    SIZES = {"a": 100, "b": 100, "c": 300, "d": 50, "e": 50}

    def __init__(self, seed=0):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        for name, n in self.SIZES.items():
            self.register_parameter(name, torch.nn.Parameter(torch.randn(n, generator=g)))


class Tied(torch.nn.Module):
    def __init__(self, seed=0):
        super().__init__()
        torch.manual_seed(seed)
        self.embed = torch.nn.Embedding(50, 8)
        self.body = torch.nn.Linear(8, 8)
        self.head = torch.nn.Linear(8, 50, bias=False)
        self.head.weight = self.embed.weight


def _same_weights(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


@pytest.mark.parametrize(
    "text, expected",
    [
        ("5MB", 5_000_000),
        ("5mb", 5_000_000),
        (" 10GB ", 10_000_000_000),
        ("1.5KB", 1_500),
        ("2TB", 2_000_000_000_000),
        ("2KiB", 2_048),
        ("1MiB", 1_048_576),
        (123, 123),
    ],
)
def test_shard_sizes_use_decimal_units_and_binary_ones_with_i(text, expected):
    assert parse_shard_size(text) == expected


@pytest.mark.parametrize("bad", ["5", "5XB", "MB", "-1MB", "abcGB", -1, 1.5, None, True])
def test_bad_shard_sizes_are_rejected_before_writing(tmp_path, bad):
    with pytest.raises((ValueError, TypeError), match="max_shard_size"):
        save_model(Flat(), tmp_path / "out", max_shard_size=bad)
    assert not (tmp_path / "out").exists()


def test_greedy_sharding_in_order_with_an_oversized_weight_alone(tmp_path):
    model = Flat()
    plan = save_model(model, tmp_path, max_shard_size="1KB")
    # 1KB = 1000 bytes. a+b = 800 fit; c (1200) exceeds the limit and gets a shard of its own,
    # emitted at once; d brings the open shard to exactly 1000; e overflows into a new shard.
    expected = {
        "model-00001-of-00003.safetensors": ["c"],
        "model-00002-of-00003.safetensors": ["a", "b", "d"],
        "model-00003-of-00003.safetensors": ["e"],
    }
    assert plan.filename_to_keys == expected
    files = sorted(os.listdir(tmp_path))
    assert files == sorted([*expected, "model.safetensors.index.json"])
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    assert index["metadata"] == {"total_size": 2400}
    assert index["weight_map"] == {k: f for f, keys in expected.items() for k in keys}
    for filename, keys in expected.items():
        assert sorted(load_file(tmp_path / filename)) == keys

    fresh = Flat(seed=1)
    assert not _same_weights(fresh, model)
    load_checkpoint_in_model(fresh, tmp_path, strict=True)
    assert _same_weights(fresh, model)


def test_one_file_and_no_index_when_everything_fits(tmp_path):
    model = Flat()
    save_model(model, tmp_path, max_shard_size="1KB")
    plan = save_model(model, tmp_path)  # default 10GB: one file; the old shards and index go
    assert not plan.is_sharded
    assert os.listdir(tmp_path) == ["model.safetensors"]
    fresh = Flat(seed=1)
    load_checkpoint_in_model(fresh, tmp_path / "model.safetensors")
    assert _same_weights(fresh, model)


def test_tied_weights_are_stored_once_and_restored(tmp_path):
    model = Tied()
    save_model(model, tmp_path, max_shard_size=1000)  # the embedding (1600 bytes) goes alone
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    assert set(index["weight_map"]) == {"embed.weight", "body.weight", "body.bias"}
    embed_bytes, body_bytes = 50 * 8 * 4, (8 * 8 + 8) * 4
    assert index["metadata"]["total_size"] == embed_bytes + body_bytes
    fresh = Tied(seed=1)
    load_checkpoint_in_model(fresh, tmp_path / "model.safetensors.index.json", strict=True)
    assert _same_weights(fresh, model)
    assert fresh.head.weight is fresh.embed.weight


def test_pickle_format_uses_the_bin_names(tmp_path):
    model = Flat()
    save_model(model, tmp_path, max_shard_size="1KB", safe_serialization=False)
    assert sorted(os.listdir(tmp_path)) == [
        "pytorch_model-00001-of-00003.bin",
        "pytorch_model-00002-of-00003.bin",
        "pytorch_model-00003-of-00003.bin",
        "pytorch_model.bin.index.json",
    ]
    fresh = Flat(seed=1)
    load_checkpoint_in_model(fresh, tmp_path)
    assert _same_weights(fresh, model)


def test_state_dict_input_and_file_destination(tmp_path):
    state = Flat().state_dict()
    save_model(state, tmp_path / "sd")
    assert os.listdir(tmp_path / "sd") == ["model.safetensors"]
    (tmp_path / "a_file").write_text("x")
    with pytest.raises(NotADirectoryError, match="is a file"):
        save_model(state, tmp_path / "a_file")
    meta = torch.nn.Linear(2, 2, device="meta")
    with pytest.raises(RuntimeError, match="meta device"):
        save_model(meta, tmp_path / "meta")


def test_strict_loading_refuses_unexpected_weights(tmp_path, caplog):
    state = dict(Flat().state_dict())
    state["not_in_model"] = torch.zeros(3)
    save_model(state, tmp_path)
    with pytest.raises(RuntimeError, match="Unexpected key.*not_in_model"):
        load_checkpoint_in_model(Flat(seed=1), tmp_path, strict=True)
    fresh = Flat(seed=1)
    load_checkpoint_in_model(fresh, tmp_path)
    assert torch.equal(fresh.a, state["a"])
    assert "not_in_model" in caplog.text


def test_loading_with_a_device_map_and_dtype(tmp_path):
    model = Flat()
    save_model(model, tmp_path)
    fresh = Flat(seed=1)
    load_checkpoint_in_model(fresh, tmp_path, device_map={"": "cpu"}, dtype="float64")
    assert fresh.a.dtype == torch.float64
    assert torch.equal(fresh.a, model.a.double())


def test_bad_checkpoint_paths_give_clear_errors(tmp_path):
    with pytest.raises(ValueError, match="does not exist"):
        load_checkpoint_in_model(Flat(), tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="no pytorch_model.bin, no model.safetensors"):
        load_checkpoint_in_model(Flat(), tmp_path / "empty")
    save_model(Flat(), tmp_path / "two", max_shard_size="1KB")
    (tmp_path / "two" / "extra.index.json").write_text("{}")
    with pytest.raises(ValueError, match="several index files"):
        load_checkpoint_in_model(Flat(), tmp_path / "two")
    (tmp_path / "two" / "extra.index.json").unlink()
    (tmp_path / "two" / "model-00002-of-00003.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match="model-00002-of-00003.safetensors"):
        load_checkpoint_in_model(Flat(), tmp_path / "two")
