"""Verification of committed checkpoints: truncated, flipped, missing files and bad manifests."""

from __future__ import annotations

import json

import pytest
import torch

from cadence.checkpointing import (
    MANIFEST_NAME,
    CheckpointCorruptError,
    CheckpointIncompleteError,
    begin_checkpoint,
    is_complete,
    open_checkpoint,
    verify,
)
from cadence.checkpointing import manifest as manifest_module


@pytest.fixture(params=["xxh3_128", "sha256", "crc32"])
def checkpoint(request, tmp_path):
    if request.param == "xxh3_128":
        pytest.importorskip("xxhash")
    writer = begin_checkpoint(tmp_path / "ckpt", checksum=request.param)
    torch.manual_seed(0)
    writer.save_tensors("model.safetensors", {"w": torch.randn(64, 64), "b": torch.randn(64)})
    writer.save_object("optimizer.bin", {"state": {0: {"exp_avg": torch.randn(64)}}, "lr": 0.1})
    writer.save_json("meta.json", {"step": 7})
    return writer.commit()


def _flip_byte(path, offset):
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x01
    path.write_bytes(bytes(data))


def test_intact_checkpoint_verifies_in_every_mode(checkpoint):
    for mode in ("sizes", "full"):
        manifest = verify(checkpoint, mode)
        assert set(manifest.files) == {"model.safetensors", "optimizer.bin", "meta.json"}
    assert is_complete(checkpoint)


def test_truncated_file_is_reported_with_its_sizes(checkpoint):
    path = checkpoint / "optimizer.bin"
    size = path.stat().st_size
    path.write_bytes(path.read_bytes()[: size // 2])
    for mode in ("sizes", "full"):
        with pytest.raises(CheckpointCorruptError) as info:
            verify(checkpoint, mode)
        message = str(info.value)
        assert "optimizer.bin: truncated" in message
        assert f"{size // 2} bytes on disk, the manifest says {size}" in message
    assert not is_complete(checkpoint)
    with pytest.raises(CheckpointCorruptError, match="optimizer.bin: truncated"):
        open_checkpoint(checkpoint)


def test_flipped_byte_passes_the_size_check_but_not_the_checksum(checkpoint):
    path = checkpoint / "model.safetensors"
    _flip_byte(path, path.stat().st_size - 10)  # inside tensor data: the file still parses
    verify(checkpoint, "sizes")
    with pytest.raises(CheckpointCorruptError) as info:
        verify(checkpoint, "full")
    assert "model.safetensors: content changed since the save" in str(info.value)
    assert info.value.problems == [p for p in info.value.problems if "model.safetensors" in p]

    # Loading refuses the file before any byte of it is deserialized (issue 13, item 1).
    with open_checkpoint(checkpoint) as ckpt:
        with pytest.raises(CheckpointCorruptError, match="model.safetensors: content changed"):
            ckpt.load_tensors("model.safetensors")


def test_corrupt_header_error_names_the_file(checkpoint):
    path = checkpoint / "optimizer.bin"
    _flip_byte(path, 0)  # breaks the zip signature
    with open_checkpoint(checkpoint) as ckpt:
        with pytest.raises(CheckpointCorruptError, match="optimizer.bin"):
            ckpt.load_object("optimizer.bin")


def test_missing_file_is_incomplete(checkpoint):
    (checkpoint / "meta.json").unlink()
    with pytest.raises(CheckpointIncompleteError, match=r"meta.json: missing \(the manifest lists"):
        verify(checkpoint, "sizes")
    with pytest.raises(CheckpointIncompleteError, match="meta.json"):
        open_checkpoint(checkpoint)


def test_missing_manifest_means_the_save_never_finished(checkpoint):
    (checkpoint / MANIFEST_NAME).unlink()
    with pytest.raises(CheckpointIncompleteError, match=f"has no {MANIFEST_NAME}"):
        verify(checkpoint)
    with pytest.raises(CheckpointIncompleteError, match="interrupted"):
        open_checkpoint(checkpoint)
    # An explicit opt-in loads folders written by other tools, without verification.
    with open_checkpoint(checkpoint, allow_unverified=True) as ckpt:
        assert ckpt.read_json("meta.json") == {"step": 7}


def test_manifest_that_disagrees_with_the_files(checkpoint):
    path = checkpoint / MANIFEST_NAME
    data = json.loads(path.read_text())
    data["files"]["meta.json"]["checksum"] = "0" * len(data["files"]["meta.json"]["checksum"])
    path.write_text(json.dumps(data))
    verify(checkpoint, "sizes")
    with pytest.raises(CheckpointCorruptError, match="meta.json: content changed"):
        verify(checkpoint, "full")

    data["files"]["meta.json"]["size"] += 1
    path.write_text(json.dumps(data))
    with pytest.raises(CheckpointCorruptError, match="meta.json: truncated"):
        verify(checkpoint, "sizes")

    data["files"]["ghost.bin"] = {"size": 1, "checksum": "00"}
    path.write_text(json.dumps(data))
    with pytest.raises(CheckpointIncompleteError, match="ghost.bin: missing"):
        verify(checkpoint, "sizes")


@pytest.mark.parametrize(
    "text, expected",
    [
        ("{not json", "unreadable"),
        ('{"format": "something-else"}', "expected 'cadence-checkpoint'"),
        (
            '{"format": "cadence-checkpoint", "format_version": 99, "files": {}}',
            "newer than this Cadence",
        ),
    ],
)
def test_unreadable_manifest(checkpoint, text, expected):
    (checkpoint / MANIFEST_NAME).write_text(text)
    with pytest.raises(CheckpointCorruptError, match=expected):
        verify(checkpoint)
    assert not is_complete(checkpoint)


def test_reader_refuses_a_file_the_checkpoint_does_not_have(checkpoint):
    with open_checkpoint(checkpoint) as ckpt:
        assert ckpt.has("meta.json") and not ckpt.has("scheduler.bin")
        with pytest.raises(CheckpointIncompleteError, match="no file 'scheduler.bin'"):
            ckpt.load_object("scheduler.bin")


def test_missing_checksum_package_degrades_to_size_checks(tmp_path, monkeypatch, caplog):
    pytest.importorskip("xxhash")
    writer = begin_checkpoint(tmp_path / "c", checksum="xxh3_128")
    writer.save_bytes("f.bin", b"data")
    writer.commit()
    _flip_byte(tmp_path / "c" / "f.bin", 0)
    monkeypatch.setattr(manifest_module, "_xxhash_installed", lambda: False)
    verify(tmp_path / "c", "full")
    assert "needs the `xxhash` package" in caplog.text
    assert manifest_module.default_checksum() == "sha256-pieces-64MiB"
