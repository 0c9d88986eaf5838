"""The files a strategy reads itself (the `torch.distributed.checkpoint` folders of FSDP's sharded
states, a whole FSDP state file, DeepSpeed's engine files), checked before anything of a
checkpoint is applied.

Cadence's own files are verified as they are read. A strategy's files are read by torch or by the
engine, after Cadence's own states were applied, and in a collective where each rank reads only
some of them: a damaged file found by one rank there would leave the others with half a state. So,
before anything is applied, every rank checks its share of the checkpoint's files in full (rank r
the names r, r + world, ...), and the problems found anywhere are agreed and raised on every rank.
FSDP's loads also read every file through the reader's verified opener (`CheckpointReader.open_file`):
a file rewritten after this check is still refused.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .errors import CheckpointCorruptError, CheckpointError, describe_problems
from .manifest import check_files, read_manifest


def check_share(path: str | os.PathLike, rank: int, world_size: int) -> list[str]:
    """Problems of this rank's share of the checkpoint's files (full checksums); [] when sound."""
    try:
        manifest = read_manifest(path)
        names = sorted(manifest.files)[rank::world_size]
        check_files(path, manifest, names, "full")
    except CheckpointError as e:
        return [f"rank {rank}: {p}" for p in e.problems] or [f"rank {rank}: {e}"]
    return []


def verify_engine_files(
    path: str | os.PathLike,
    rank: int,
    world_size: int,
    agree: Callable[[list[Any]], list[Any]],
) -> None:
    """Check every file of the checkpoint at `path`, split over the ranks, before a strategy reads
    its own files; raise CheckpointCorruptError on every rank when any rank found a problem.

    `agree` gathers one object from every rank (a collective: every rank must call this).
    """
    found = agree([check_share(path, rank, world_size)])
    problems = [problem for part in found for problem in (part or [])]
    if problems:
        raise CheckpointCorruptError(
            describe_problems(
                f"Checkpoint {Path(path)} cannot be loaded, nothing of it was applied "
                "(load an older checkpoint or save again):",
                problems,
            ),
            path=path,
            problems=problems,
        )
