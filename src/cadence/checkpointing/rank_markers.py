"""The markers ranks drop into a checkpoint's temporary folder, and the committer's gathering of them.

A marker `.cadence-rank-<r>.json` says rank r finished writing (with the size and checksum of each of
its files); a failure marker says it gave up, and why. They live only inside the temporary folder:
the committer turns them into the per-rank manifests and deletes them before the folder is renamed.
"""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path

from .errors import CheckpointCommitError, describe_problems
from .manifest import FileRecord

MARKER_RE = re.compile(r"^\.cadence-rank-(\d+)(\.failed)?\.json(\.partial)?$")


def marker_name(rank: int) -> str:
    """Name of the marker rank `rank` drops when its files are durable and hashed."""
    return f".cadence-rank-{rank:05d}.json"


def failure_marker_name(rank: int) -> str:
    """Name of the marker rank `rank` drops when its part of the save failed."""
    return f".cadence-rank-{rank:05d}.failed.json"


def write_marker(path: Path, data: dict) -> None:
    """Make the marker `path` appear atomically with `data` as JSON."""
    # Markers only coordinate the commit inside a folder nobody loads: a crash makes the whole
    # temporary folder garbage, so they need no fsync, only an atomic appearance (rename).
    tmp = path.with_name(path.name + ".partial")
    tmp.write_bytes(json.dumps(data).encode())
    os.replace(tmp, path)


def rank_failure(marker: Path, rank: int, final_dir: Path) -> BaseException:
    """The error another rank reported through its failure marker, raised on the committer."""
    try:
        info = json.loads(marker.read_text())
    except (OSError, ValueError):
        info = {}
    message = f"rank {rank} failed while writing checkpoint {final_dir}: " + str(
        info.get("message", "unknown error")
    )
    code = info.get("errno")
    if isinstance(code, int) and not isinstance(code, bool):
        return OSError(code, message)
    return CheckpointCommitError(message, path=final_dir)


def gather_rank_records(
    tmp_dir: Path, final_dir: Path, ranks: list[int], timeout: float, checksum: str, own_rank: int
) -> dict[str, tuple[int, FileRecord]]:
    """{file name: (rank that wrote it, record)} from the markers of `ranks`, waiting up to
    `timeout` seconds for them; the first failure marker (or a missing marker) is raised."""
    deadline = time.monotonic() + max(0.0, timeout)
    while True:
        missing = [r for r in ranks if not (tmp_dir / marker_name(r)).exists()]
        for rank in missing:
            failed = tmp_dir / failure_marker_name(rank)
            if failed.exists():
                raise rank_failure(failed, rank, final_dir)
        if not missing or time.monotonic() >= deadline:
            break
        time.sleep(0.02)
    if missing:
        raise CheckpointCommitError(
            f"Cannot commit checkpoint {final_dir}: rank(s) {missing} did not finish "
            f"writing their files into {tmp_dir} (no marker"
            + (f" after {timeout:g} s" if timeout else "")
            + "). Every process must call save_state and rank_done() before the commit.",
            path=final_dir,
        )
    records: dict[str, tuple[int, FileRecord]] = {}
    problems = []
    for rank in ranks:
        data = json.loads((tmp_dir / marker_name(rank)).read_text())
        if not isinstance(data, dict) or not isinstance(data.get("files"), dict):
            problems.append(f"rank {rank}: its marker is malformed")
            continue
        if data.get("checksum_algorithm") != checksum:
            problems.append(
                f"rank {rank} hashed with {data.get('checksum_algorithm')!r}, "
                f"rank {own_rank} with {checksum!r}"
            )
            continue
        for name, (size, digest) in data["files"].items():
            record = FileRecord(int(size), str(digest))
            if name in records and records[name][1] != record:
                problems.append(
                    f"{name}: written differently by ranks {records[name][0]} and {rank}; "
                    "each file must be written by one process"
                )
            records.setdefault(name, (rank, record))
    if problems:
        raise CheckpointCommitError(
            describe_problems(f"Cannot commit checkpoint {final_dir}:", problems),
            path=final_dir,
            problems=problems,
        )
    return records
