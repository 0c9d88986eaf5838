"""Atomic commit of checkpoint folders: temporary sibling, manifest last, rename into place."""

from __future__ import annotations

import json
import os
import threading
import time

import pytest

from cadence.checkpointing import (
    MANIFEST_NAME,
    CheckpointCommitError,
    begin_checkpoint,
    cleanup_stale_siblings,
    is_complete,
    open_checkpoint,
    read_manifest,
    recover_interrupted_commit,
    verify,
)
from cadence.checkpointing import atomic as atomic_module
from cadence.checkpointing.manifest import describe_file, rank_manifest_name


def _entries(path):
    return sorted(os.listdir(path))


def test_commit_writes_files_then_manifest_and_renames(tmp_path):
    final = tmp_path / "checkpoint_0"
    writer = begin_checkpoint(final, checksum="sha256")
    writer.save_bytes("a.bin", b"hello")
    writer.save_json("meta.json", {"step": 3})
    writer.save_bytes("sub/b.bin", b"x" * 1000)
    # Nothing is visible under the final name before the commit.
    assert not final.exists()
    assert _entries(tmp_path) == [writer.tmp_dir.name]
    assert not is_complete(writer.tmp_dir)

    assert writer.commit(metadata={"step": 3}) == final
    assert _entries(tmp_path) == ["checkpoint_0"]
    assert _entries(final) == ["a.bin", MANIFEST_NAME, rank_manifest_name(0), "meta.json", "sub"]
    manifest = read_manifest(final)
    assert set(manifest.files) == {"a.bin", "meta.json", "sub/b.bin"}
    assert manifest.files["a.bin"].size == 5
    assert manifest.files["sub/b.bin"].size == 1000
    assert manifest.files["a.bin"] == describe_file(final / "a.bin", "sha256")
    assert manifest.world_size == 1 and manifest.ranks == [0]
    assert manifest.metadata == {"step": 3}
    assert manifest.format_version == 1
    import torch

    assert manifest.torch_version == torch.__version__
    assert manifest.cadence_version not in ("", None)
    assert abs(manifest.created - time.time()) < 3600
    verify(final, "full")


def test_replacing_an_existing_folder_is_atomic_and_keeps_foreign_files(tmp_path):
    final = tmp_path / "out"
    first = begin_checkpoint(final)
    first.save_bytes("model.bin", b"old weights")
    first.save_bytes("only_in_old.bin", b"stale")
    first.commit()
    (final / "notes.txt").write_text("user file")

    second = begin_checkpoint(final)
    second.save_bytes("model.bin", b"new weights!")
    second.commit()
    # The new checkpoint's files, plus the user's file; not the previous save's leftovers.
    assert _entries(final) == [MANIFEST_NAME, rank_manifest_name(0), "model.bin", "notes.txt"]
    assert (final / "model.bin").read_bytes() == b"new weights!"
    assert (final / "notes.txt").read_text() == "user file"
    assert set(read_manifest(final).files) == {"model.bin"}
    assert _entries(tmp_path) == ["out"]
    verify(final)


def test_replacing_a_plain_folder_keeps_every_file_it_does_not_overwrite(tmp_path):
    final = tmp_path / "out"
    final.mkdir()
    (final / "model.bin").write_bytes(b"x")
    (final / "other.bin").write_bytes(b"kept")
    writer = begin_checkpoint(final)
    writer.save_bytes("model.bin", b"replaced")
    writer.commit()
    assert (final / "model.bin").read_bytes() == b"replaced"
    assert (final / "other.bin").read_bytes() == b"kept"
    assert set(read_manifest(final).files) == {"model.bin"}


def test_fallback_two_renames_and_recovery_after_a_crash_between_them(tmp_path, monkeypatch):
    monkeypatch.setattr(atomic_module, "exchange_paths", lambda a, b: False)
    final = tmp_path / "out"
    w = begin_checkpoint(final)
    w.save_bytes("f.bin", b"v1")
    w.commit()
    w = begin_checkpoint(final)
    w.save_bytes("f.bin", b"v2")
    w.commit()
    assert (final / "f.bin").read_bytes() == b"v2"
    assert _entries(tmp_path) == ["out"]

    # Reproduce the state a kill between the two renames leaves: the previous checkpoint moved
    # aside, the complete new one not yet renamed in.
    w = begin_checkpoint(final)
    w.save_bytes("f.bin", b"v3")
    w.rank_done()
    records = w._gather_records([0], 0.0)
    manifest = atomic_module.Manifest(
        files={n: r for n, (_, r) in records.items()}, checksum_algorithm=w.checksum
    )
    (w.tmp_dir / ".cadence-rank-00000.json").unlink()
    (w.tmp_dir / MANIFEST_NAME).write_text(manifest.to_json())
    os.rename(final, tmp_path / f".out.old-{w.token}")
    w._finish()
    assert not final.exists()

    # Opening the checkpoint finishes the interrupted replacement.
    with open_checkpoint(final) as ckpt:
        assert ckpt.read_bytes("f.bin") == b"v3"
        ckpt.finish()
    assert recover_interrupted_commit(final) is False
    cleanup_stale_siblings(tmp_path)
    assert _entries(tmp_path) == ["out"]


def test_recovery_falls_back_to_the_previous_checkpoint_when_the_new_one_is_incomplete(tmp_path):
    final = tmp_path / "out"
    w = begin_checkpoint(final)
    w.save_bytes("f.bin", b"previous")
    w.commit()
    partial = tmp_path / ".out.tmp-deadbeef"
    partial.mkdir()
    (partial / "f.bin").write_bytes(b"half")
    os.rename(final, tmp_path / ".out.old-deadbeef")
    assert recover_interrupted_commit(final)
    assert (final / "f.bin").read_bytes() == b"previous"
    verify(final)


def test_ranks_write_into_one_folder_and_commit_waits_for_every_marker(tmp_path):
    final = tmp_path / "ckpt"
    token = "tok123"
    rank0 = begin_checkpoint(final, token=token, rank=0)
    rank1 = begin_checkpoint(final, token=token, rank=1)
    assert rank0.tmp_dir == rank1.tmp_dir
    assert not rank1.committer
    rank0.save_bytes("model.bin", b"weights")
    rank0.save_bytes("random_states_0.pkl", b"rng0")
    rank1.save_bytes("random_states_1.pkl", b"rng1")

    with pytest.raises(CheckpointCommitError, match=r"rank\(s\) \[1\] did not finish"):
        rank0.commit(world_size=2)
    assert not final.exists()

    rank0 = begin_checkpoint(final, token="tok456", rank=0)
    rank1 = begin_checkpoint(final, token="tok456", rank=1)
    rank0.save_bytes("model.bin", b"weights")
    rank1.save_bytes("random_states_1.pkl", b"rng1")
    with pytest.raises(CheckpointCommitError, match="not the committing process"):
        rank1.commit(world_size=2)

    def finish_later():
        time.sleep(0.3)
        rank1.rank_done()

    thread = threading.Thread(target=finish_later)
    thread.start()
    rank0.commit(world_size=2, timeout=30)
    thread.join()
    manifest = verify(final, "full")
    assert set(manifest.files) == {"model.bin", "random_states_1.pkl"}
    assert manifest.world_size == 2 and manifest.ranks == [0, 1]
    assert not any(name.startswith(".cadence-rank") for name in os.listdir(final))


def test_two_ranks_writing_one_file_differently_is_a_commit_error(tmp_path):
    final = tmp_path / "ckpt"
    a = begin_checkpoint(final, token="t1", rank=0)
    b = begin_checkpoint(final, token="t1", rank=1)
    a.save_bytes("shared.bin", b"from rank 0")
    a.rank_done()
    b.save_bytes("shared.bin", b"from rank 1, longer")
    b.rank_done()
    with pytest.raises(
        CheckpointCommitError, match="shared.bin: written differently by ranks 0 and 1"
    ):
        a.commit(world_size=2)
    assert not final.exists()


def test_files_written_by_other_code_are_included(tmp_path):
    final = tmp_path / "ckpt"
    writer = begin_checkpoint(final)
    (writer.tmp_dir / "engine").mkdir()
    (writer.tmp_dir / "engine" / "shard.pt").write_bytes(b"engine state")
    (writer.tmp_dir / "hook.txt").write_text("written by a hook")
    writer.add_file("hook.txt")
    writer.commit()
    assert set(read_manifest(final).files) == {"engine/shard.pt", "hook.txt"}
    verify(final, "full")


def test_bad_arguments_fail_before_any_side_effect(tmp_path):
    a_file = tmp_path / "file.txt"
    a_file.write_text("x")
    with pytest.raises(NotADirectoryError, match="is a file"):
        begin_checkpoint(a_file)
    with pytest.raises(ValueError, match="token"):
        begin_checkpoint(tmp_path / "x", token="../evil")
    with pytest.raises(ValueError, match="checksum algorithm"):
        begin_checkpoint(tmp_path / "x", checksum="md4")
    assert _entries(tmp_path) == ["file.txt"]

    writer = begin_checkpoint(tmp_path / "x")
    for bad in ("../escape.bin", "/abs.bin", MANIFEST_NAME, ".cadence-rank-00000.json", ""):
        with pytest.raises(ValueError):
            writer.save_bytes(bad, b"x")
    with pytest.raises(FileNotFoundError, match="nothing.bin"):
        writer.add_file("nothing.bin")
    writer.commit()
    with pytest.raises(Exception, match="already finished"):
        writer.save_bytes("late.bin", b"x")


def test_abort_and_context_manager_remove_the_temporary_folder(tmp_path):
    writer = begin_checkpoint(tmp_path / "a")
    writer.save_bytes("f", b"1")
    writer.abort()
    assert _entries(tmp_path) == []
    with pytest.raises(RuntimeError, match="boom"):
        with begin_checkpoint(tmp_path / "b") as w:
            w.save_bytes("f", b"1")
            raise RuntimeError("boom")
    assert _entries(tmp_path) == []


def test_cleanup_removes_leftovers_of_killed_saves_but_not_saves_in_flight(tmp_path):
    (tmp_path / ".ckpt.tmp-0001").mkdir()
    (tmp_path / ".ckpt.tmp-0001" / "model.bin").write_bytes(b"half")
    (tmp_path / ".other.deleting-0002").mkdir()
    (tmp_path / "unrelated").mkdir()
    in_flight = begin_checkpoint(tmp_path / "ckpt")  # cleans ckpt's leftovers only
    assert _entries(tmp_path) == sorted(
        [".other.deleting-0002", in_flight.tmp_dir.name, "unrelated"]
    )
    removed = cleanup_stale_siblings(tmp_path)
    assert [p.name for p in removed] == [".other.deleting-0002"]
    assert in_flight.tmp_dir.exists()
    in_flight.commit()
    assert _entries(tmp_path) == ["ckpt", "unrelated"]


def test_manifest_json_is_plain_and_lists_sizes_and_checksums(tmp_path):
    writer = begin_checkpoint(tmp_path / "c", checksum="crc32")
    writer.save_bytes("x.bin", b"123456789")
    writer.commit()
    data = json.loads((tmp_path / "c" / MANIFEST_NAME).read_text())
    # CRC-32 of "123456789" is the standard check value 0xCBF43926.
    assert data["files"] == {"x.bin": {"size": 9, "checksum": "cbf43926"}}
    assert data["checksum_algorithm"] == "crc32"
    assert data["format"] == "cadence-checkpoint"
