"""Automatic checkpoint naming, newest-complete lookup and total_limit pruning."""

from __future__ import annotations

import os

import pytest

from cadence.checkpointing import (
    automatic_checkpoint_dir,
    begin_checkpoint,
    checkpoint_index,
    checkpoints_dir,
    cleanup_checkpoints_dir,
    latest_checkpoint,
    list_checkpoints,
    next_iteration,
    prune_checkpoints,
)


def _save(project, iteration, payload=b"x"):
    writer = begin_checkpoint(automatic_checkpoint_dir(project, iteration))
    writer.save_bytes("state.bin", payload)
    return writer.commit()


def _incomplete(project, iteration):
    path = checkpoints_dir(project) / f"checkpoint_{iteration}"
    path.mkdir(parents=True)
    (path / "state.bin").write_bytes(b"half written")
    return path


def test_automatic_names_follow_the_iteration(tmp_path):
    assert automatic_checkpoint_dir(tmp_path, 0) == tmp_path / "checkpoints" / "checkpoint_0"
    assert checkpoints_dir(tmp_path) == tmp_path / "checkpoints"
    assert next_iteration(checkpoints_dir(tmp_path)) == 0
    for i in range(3):
        _save(tmp_path, i)
    assert sorted(os.listdir(tmp_path / "checkpoints")) == [f"checkpoint_{i}" for i in range(3)]
    assert next_iteration(checkpoints_dir(tmp_path)) == 3
    assert checkpoint_index(tmp_path / "checkpoints" / "checkpoint_12") == 12
    assert checkpoint_index(tmp_path / "checkpoints" / ".checkpoint_12.tmp-ab") is None


def test_saving_onto_an_existing_iteration_is_an_error(tmp_path):
    _save(tmp_path, 0)
    with pytest.raises(ValueError, match=r"checkpoint_0 \(0\) already exists.*e.g. 1"):
        automatic_checkpoint_dir(tmp_path, 0)


def test_automatic_naming_needs_a_project_dir():
    with pytest.raises(ValueError, match="project_dir"):
        checkpoints_dir(None)


def test_latest_ignores_incomplete_checkpoints_and_leftovers(tmp_path):
    _save(tmp_path, 0)
    _save(tmp_path, 1)
    _incomplete(tmp_path, 2)
    (checkpoints_dir(tmp_path) / ".checkpoint_3.tmp-abcd").mkdir()
    assert (
        latest_checkpoint(checkpoints_dir(tmp_path)) == checkpoints_dir(tmp_path) / "checkpoint_1"
    )
    entries = list_checkpoints(checkpoints_dir(tmp_path))
    assert [(e.index, e.complete) for e in entries] == [(0, True), (1, True), (2, False)]
    assert latest_checkpoint(tmp_path / "nothing_here") is None


def test_numbers_sort_numerically_not_as_text(tmp_path):
    for i in (2, 10, 9):
        _save(tmp_path, i)
    assert latest_checkpoint(checkpoints_dir(tmp_path)).name == "checkpoint_10"


def test_total_limit_keeps_the_newest_complete_checkpoints(tmp_path):
    root = checkpoints_dir(tmp_path)
    for i in range(5):
        _save(tmp_path, i)
        prune_checkpoints(root, total_limit=2)
        expected = [f"checkpoint_{j}" for j in range(max(0, i - 1), i + 1)]
        assert sorted(os.listdir(root)) == expected


def test_pruning_never_deletes_the_newest_complete_checkpoint(tmp_path):
    root = checkpoints_dir(tmp_path)
    _incomplete(tmp_path, 0)
    _save(tmp_path, 1)
    _save(tmp_path, 2)
    _incomplete(tmp_path, 3)
    _incomplete(tmp_path, 4)
    deleted = prune_checkpoints(root, total_limit=1)
    # Old complete and old incomplete folders go; the newest complete one stays whatever newer
    # incomplete folders exist.
    assert sorted(p.name for p in deleted) == ["checkpoint_0", "checkpoint_1"]
    assert latest_checkpoint(root).name == "checkpoint_2"
    assert sorted(os.listdir(root)) == ["checkpoint_2", "checkpoint_3", "checkpoint_4"]


def test_pruning_with_no_complete_checkpoint_deletes_nothing(tmp_path):
    root = checkpoints_dir(tmp_path)
    _incomplete(tmp_path, 0)
    assert prune_checkpoints(root, total_limit=1) == []
    assert os.listdir(root) == ["checkpoint_0"]


@pytest.mark.parametrize("bad", [0, -1, 1.5, "2", True])
def test_total_limit_must_be_a_positive_int(tmp_path, bad):
    _save(tmp_path, 0)
    with pytest.raises(ValueError, match="total_limit must be a positive int"):
        prune_checkpoints(checkpoints_dir(tmp_path), total_limit=bad)


def test_cleanup_removes_leftovers_of_killed_saves_and_deletions(tmp_path):
    _save(tmp_path, 0)
    root = checkpoints_dir(tmp_path)
    (root / ".checkpoint_1.tmp-aaaa").mkdir()
    (root / ".checkpoint_1.tmp-aaaa" / "state.bin").write_bytes(b"partial")
    (root / ".checkpoint_0.deleting-bbbb").mkdir()
    removed = cleanup_checkpoints_dir(root)
    assert sorted(p.name for p in removed) == [
        ".checkpoint_0.deleting-bbbb",
        ".checkpoint_1.tmp-aaaa",
    ]
    assert os.listdir(root) == ["checkpoint_0"]
