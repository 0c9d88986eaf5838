"""Automatic checkpoint naming and rotation: `project_dir/checkpoints/checkpoint_<i>`.

As in Accelerate, the i-th save goes to `checkpoint_<iteration>` where `iteration` starts at
`ProjectConfiguration.iteration` (default 0) and grows by one per save, and saving onto an existing
`checkpoint_<i>` is an error. Unlike Accelerate, old checkpoints are pruned only after the new
one is committed, only complete checkpoints count towards `total_limit`, and the newest complete
checkpoint is never deleted.
"""

from __future__ import annotations

import logging
import os
import re
from dataclasses import dataclass
from pathlib import Path

from .atomic import cleanup_stale_siblings, new_token
from .fs import fsync_dir, remove_later, remove_tree
from .generation import fence
from .manifest import VerifyMode, is_complete

logger = logging.getLogger(__name__)

CHECKPOINTS_DIRNAME = "checkpoints"
CHECKPOINT_PREFIX = "checkpoint_"
_CHECKPOINT_RE = re.compile(r"^checkpoint_(\d+)$")


@dataclass(frozen=True)
class CheckpointEntry:
    """One `checkpoint_<n>` directory: its index, path and whether it is complete."""

    index: int
    path: Path
    complete: bool


def checkpoints_dir(project_dir: str | os.PathLike | None) -> Path:
    """The `checkpoints` directory under `project_dir`; raise when there is none."""
    if project_dir is None:
        raise ValueError(
            "automatic_checkpoint_naming needs a project_dir: pass "
            "ProjectConfiguration(project_dir=..., automatic_checkpoint_naming=True)."
        )
    return Path(os.path.expanduser(os.fspath(project_dir))) / CHECKPOINTS_DIRNAME


def automatic_checkpoint_dir(project_dir: str | os.PathLike | None, iteration: int) -> Path:
    """Folder of the save number `iteration`; an error if it already exists (as in Accelerate)."""
    path = checkpoints_dir(project_dir) / f"{CHECKPOINT_PREFIX}{int(iteration)}"
    if path.exists():
        raise ValueError(
            f"Checkpoint directory {path} ({iteration}) already exists. Set "
            "ProjectConfiguration.iteration (accelerator.project_configuration.iteration) to the "
            f"next free number, e.g. {next_iteration(path.parent)}."
        )
    return path


def list_checkpoints(
    directory: str | os.PathLike, mode: VerifyMode = "sizes"
) -> list[CheckpointEntry]:
    """Every `checkpoint_<i>` folder in `directory`, oldest first, with whether it is complete."""
    directory = Path(directory)
    if not directory.is_dir():
        return []
    entries = []
    for entry in directory.iterdir():
        m = _CHECKPOINT_RE.match(entry.name)
        if m and entry.is_dir():
            entries.append(CheckpointEntry(int(m.group(1)), entry, is_complete(entry, mode)))
    entries.sort(key=lambda e: e.index)
    return entries


def latest_checkpoint(directory: str | os.PathLike, mode: VerifyMode = "sizes") -> Path | None:
    """The newest complete checkpoint in `directory` (incomplete ones and leftovers are ignored).

    A checkpoint that vanishes while it is looked at was pruned by a job saving meanwhile, which
    committed a newer one first: the folder is then listed again (a few times at most), so a
    concurrent rotation never makes "no checkpoint" out of a folder that always holds one.
    """
    directory = Path(directory)
    for _attempt in range(_RESCANS):
        if not directory.is_dir():
            return None
        numbered = sorted(
            (
                (int(m.group(1)), entry)
                for entry in _entries(directory)
                if (m := _CHECKPOINT_RE.match(entry.name)) and entry.is_dir()
            ),
            reverse=True,
        )
        vanished = False
        for _index, path in numbered:
            if is_complete(path, mode):
                return path
            if not path.exists():
                vanished = True  # pruned meanwhile: a newer one was committed before
                break
            logger.warning("Ignoring incomplete checkpoint %s", path)
        if not vanished:
            return None
    return None


_RESCANS = 5


def _entries(directory: Path) -> list[Path]:
    """The folder's entries; none when the folder itself was removed meanwhile."""
    try:
        return list(directory.iterdir())
    except FileNotFoundError:
        return []


def checkpoint_index(path: str | os.PathLike) -> int | None:
    """The index `n` of a `checkpoint_<n>` path, or None for another name."""
    m = _CHECKPOINT_RE.match(Path(path).name)
    return int(m.group(1)) if m else None


def next_iteration(directory: str | os.PathLike) -> int:
    """One more than the highest `checkpoint_<i>` present (0 when none): a free save number."""
    directory = Path(directory)
    if not directory.is_dir():
        return 0
    indices = [int(m.group(1)) for e in directory.iterdir() if (m := _CHECKPOINT_RE.match(e.name))]
    return max(indices, default=-1) + 1


def prune_checkpoints(
    directory: str | os.PathLike,
    total_limit: int,
    *,
    durable: bool = True,
    background: bool = False,
) -> list[Path]:
    """Keep the `total_limit` newest complete checkpoints; delete older ones. Call after a commit.

    Incomplete `checkpoint_<i>` folders older than the oldest kept one are deleted too; the newest
    complete checkpoint is never deleted. Each deletion first renames the folder to a hidden name,
    so a kill mid-deletion never leaves a half-deleted folder under a checkpoint name; with
    `background`, freeing the renamed folders' blocks happens in a background thread.
    """
    if isinstance(total_limit, bool) or not isinstance(total_limit, int) or total_limit < 1:
        raise ValueError(
            f"total_limit must be a positive int (how many checkpoints to keep), got {total_limit!r}"
        )
    fence(directory, "delete")  # a superseded worker exits here
    entries = list_checkpoints(directory)
    complete = [e for e in entries if e.complete]
    if not complete:
        return []
    kept = complete[-total_limit:]
    oldest_kept = kept[0].index
    doomed = [e for e in entries if e.index < oldest_kept]
    deleted = []
    for entry in doomed:
        hidden = entry.path.parent / f".{entry.path.name}.deleting-{new_token()}"
        os.rename(entry.path, hidden)
        if durable:
            fsync_dir(entry.path.parent)
        if background:
            remove_later(hidden)
        else:
            remove_tree(hidden)
        deleted.append(entry.path)
    if deleted:
        logger.info(
            "Deleted %d old checkpoint(s) to keep total_limit=%d", len(deleted), total_limit
        )
    return deleted


def cleanup_checkpoints_dir(directory: str | os.PathLike) -> list[Path]:
    """Remove leftovers of killed saves and deletions (hidden `.checkpoint_<i>.tmp-*` folders)."""
    fence(directory, "delete")  # a newer generation's folders in progress look like leftovers
    return cleanup_stale_siblings(directory)
