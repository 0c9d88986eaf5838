"""Verifying a checkpoint once per machine: the ranks of a machine that load the same files split
the checksums between them and agree on the result before any byte is used.

Every rank maps the files it needs (copy-on-write, `mmap`), so the ranks of a machine read the
same pages of the page cache and nothing is copied until a state is applied. Each file that
several ranks of a machine need is hashed by one of them (`assign_shares`: the largest files
first, each to the rank of the machine that needs it and has the fewest bytes to hash so far); a
file only one rank needs (its RNG state, its shard) is hashed by that rank. The ranks then
exchange what they found (`agree`, one gather over the process group): a file that failed
anywhere fails the load on every rank, before anything is deserialized or applied. A rank that
dies meanwhile makes the exchange fail on the others, which raise `SharedVerificationError`.

What binds a mapping to the bytes another rank hashed is the file's identity (device, inode,
size, modification and change times): each rank compares its own mapping's identity with the
one the hashing rank reported, and checks it again before the states are applied. A committed
checkpoint is never written in place by Cadence (a save writes a new folder and renames it), so
an identity that did not change means the bytes did not; like `torch.load(mmap=True)`, a
process that writes into a file in place while its tensors are being copied out is not detected.
"""

from __future__ import annotations

import mmap
import os
import socket
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .checksums import new_hasher
from .errors import (
    CheckpointCorruptError,
    CheckpointError,
    SharedVerificationError,
    describe_problems,
)
from .safe_io import open_member

# Hashed in pieces of this size, each right after its pages were mapped in.
_HASH_PIECE = 8 << 20
# Linux 5.14+: map every page of a range in one call, read-only (no copy in a private mapping).
_MADV_POPULATE_READ = getattr(mmap, "MADV_POPULATE_READ", 22 if os.name == "posix" else None)

_counter_lock = threading.Lock()
_hashed = [0]


def hashed_bytes() -> int:
    """Bytes this process has checksummed while loading checkpoints (every verified read counts):
    with several ranks on a machine, each byte of a file they share is counted by one of them."""
    return _hashed[0]


def count_hashed(size: int) -> None:
    """Add `size` bytes to `hashed_bytes()` (called by every checksum of a loaded file)."""
    with _counter_lock:
        _hashed[0] += size


def node_name() -> str:
    """What identifies this machine's page cache: its host name and, on Linux, its boot id."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
    except OSError:
        boot = ""
    return f"{socket.gethostname()}/{boot}"


Identity = tuple[int, int, int, int, int]


def _folder_id(path: Path) -> str:
    try:
        info = os.stat(path)
    except OSError:
        return os.fspath(path)
    return f"{info.st_dev}:{info.st_ino}"


def _identity(fd: int) -> Identity:
    info = os.fstat(fd)
    return (info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns)


class MappedFile:
    """One checkpoint file mapped copy-on-write: its pages are the page cache's until written."""

    def __init__(self, directory: Path, name: str, size: int) -> None:
        self.name = name
        self.size = size
        fd = open_member(directory, name, size)
        try:
            self.identity = _identity(fd)
            # ACCESS_COPY: a private, writable mapping, so tensors cut out of it can be written
            # (an optimizer's state after a resume) without ever writing into the file.
            self._map = mmap.mmap(fd, size, access=mmap.ACCESS_COPY) if size else None
            self._fd = fd
        except BaseException:
            os.close(fd)
            raise

    def view(self) -> memoryview:
        """The file's bytes (empty for an empty file)."""
        return memoryview(self._map) if self._map is not None else memoryview(b"")

    def tensor(self) -> Any:
        """The file as a uint8 tensor over the mapping (no copy)."""
        import torch

        if self._map is None:
            return torch.empty(0, dtype=torch.uint8)
        return torch.frombuffer(self._map, dtype=torch.uint8)

    def read_ahead(self) -> None:
        """Ask the kernel to start reading the whole file into the page cache (a hint): on a node
        whose cache does not hold it, the disk works while earlier files are hashed."""
        if self.size and hasattr(os, "posix_fadvise") and self._fd >= 0:
            try:
                os.posix_fadvise(self._fd, 0, self.size, os.POSIX_FADV_WILLNEED)
            except OSError:
                pass  # a hint only: hashing reads the pages either way

    def unchanged(self) -> bool:
        """Whether the file still has the identity it had when it was mapped."""
        return self._fd >= 0 and _identity(self._fd) == self.identity

    def hash(self, algorithm: str) -> str:
        """The file's checksum, computed from the mapping (counted in `hashed_bytes`)."""
        hasher = new_hasher(algorithm)
        if self._map is not None:
            if _MADV_POPULATE_READ is not None:
                try:  # one call maps the pages (read from disk if they are not cached)
                    self._map.madvise(_MADV_POPULATE_READ)
                except (OSError, ValueError):
                    self._map.madvise(mmap.MADV_WILLNEED)
            view = memoryview(self._map)
            try:
                for start in range(0, self.size, _HASH_PIECE):
                    hasher.update(view[start : start + _HASH_PIECE])
            finally:
                view.release()
        count_hashed(self.size)
        return hasher.hexdigest()

    def close(self) -> None:
        """Close the descriptor; the mapping lives as long as the tensors cut out of it."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


@dataclass(frozen=True)
class Need:
    """What one rank loads: its machine and the files it needs, with their sizes."""

    rank: int
    node: str
    files: dict[str, int]


def assign_shares(needs: Iterable[Need]) -> dict[int, list[str]]:
    """Which files each rank hashes: every file a machine needs is hashed by exactly one of the
    ranks of that machine that need it, the largest files first, each to the rank with the fewest
    bytes so far (ties: the lower rank). The same on every rank, given the same `needs`."""
    by_node: dict[str, list[Need]] = {}
    for need in needs:
        by_node.setdefault(need.node, []).append(need)
    shares: dict[int, list[str]] = {}
    for ranks in by_node.values():
        load = {need.rank: 0 for need in ranks}
        sizes: dict[str, int] = {}
        needers: dict[str, list[int]] = {}
        for need in ranks:
            shares.setdefault(need.rank, [])
            for name, size in need.files.items():
                sizes[name] = max(size, sizes.get(name, 0))
                needers.setdefault(name, []).append(need.rank)
        for name in sorted(sizes, key=lambda n: (-sizes[n], n)):
            rank = min(needers[name], key=lambda r: (load[r], r))
            shares[rank].append(name)
            load[rank] += sizes[name]
    return shares


def _exchange(agree: Callable[[list], list], mine: Any, rank: int, path: Path, what: str) -> list:
    try:
        return agree([mine])
    except CheckpointError:
        raise
    except Exception as e:  # a rank died or left: every survivor stops here, none applies
        raise SharedVerificationError(
            f"Process {rank}: load_state({os.fspath(path)!r}) stopped: the processes of a machine "
            f"verify a checkpoint together, and {what} failed ({type(e).__name__}: {e}). Another "
            "process probably failed or died; nothing of the checkpoint was applied. Check the "
            "other processes' output.",
            path=path,
        ) from e


def verify_together(
    path: Path,
    files: dict[str, tuple[int, str | None, str | None]] | None,
    rank: int,
    agree: Callable[[list], list],
    failure: CheckpointError | None = None,
) -> dict[str, MappedFile]:
    """Map and verify `files` ({name: (size, checksum, algorithm)}: what this rank loads) with the
    other ranks; a collective: every rank calls it once, `failure` when it could not even tell
    what to load (it is raised on this rank, the others raise naming it).

    Returns the mapped files, all verified (on this machine, by some rank); raises on every rank,
    before any byte is used, when any file of any rank failed.
    """
    mapped: dict[str, MappedFile] = {}
    try:
        for name, (size, _, _) in (files or {}).items():
            mapped[name] = MappedFile(path, name, size)
    except CheckpointError as e:
        failure = failure or e
    try:
        return _verify_mapped(path, files or {}, mapped, rank, agree, failure)
    except BaseException:
        for one in mapped.values():
            one.close()
        raise


def _check_share(
    names: list[str],
    files: dict[str, tuple[int, str | None, str | None]],
    mapped: dict[str, MappedFile],
    everyone: list[dict],
    node: str,
    rank: int,
) -> list[str]:
    """Hash the files `names` (this rank's share); the problems found."""
    problems: list[str] = []
    for name in names:
        mapped[name].read_ahead()
    for name in names:
        one = mapped[name]
        _, checksum, algorithm = files[name]
        if checksum is not None and algorithm is not None:
            actual = one.hash(algorithm)
            if actual != checksum:
                problems.append(
                    f"{name}: content changed since the save ({algorithm} is {actual}, the "
                    f"manifest says {checksum}; found by process {rank})"
                )
        if not one.unchanged():
            problems.append(f"{name}: changed while process {rank} verified it")
        # The others use this machine's verification only of the very file this rank hashed.
        others = [
            e["rank"]
            for e in everyone
            if e["node"] == node and tuple(e["ids"].get(name, one.identity)) != one.identity
        ]
        if others:
            problems.append(
                f"{name}: processes {others} opened another file than process {rank} verified "
                "(was it replaced during the load?)"
            )
    return problems


def _verify_mapped(
    path: Path,
    files: dict[str, tuple[int, str | None, str | None]],
    mapped: dict[str, MappedFile],
    rank: int,
    agree: Callable[[list], list],
    failure: CheckpointError | None,
) -> dict[str, MappedFile]:
    opened = {
        "rank": rank,
        # Ranks share work only on one machine and only for one folder: ranks that load folders
        # of the same name from different places (each its own copy) verify each their own.
        "node": f"{node_name()}|{_folder_id(path)}",
        "files": {n: m.size for n, m in mapped.items()},
        "ids": {n: m.identity for n, m in mapped.items()},
    }
    if failure is not None:
        opened["failure"] = str(failure)[:2000]
    everyone = _exchange(agree, opened, rank, path, "the exchange of what each process loads")
    failed = [entry for entry in everyone if entry.get("failure")]
    if failure is not None:
        raise failure
    if failed:
        raise CheckpointError(
            f"Process {rank}: {path} cannot be loaded: process {failed[0]['rank']} could not "
            f"open it ({failed[0]['failure']}). Nothing of it was applied.",
            path=path,
            problems=[f"rank {entry['rank']}: {entry['failure']}" for entry in failed],
        )
    shares = assign_shares(Need(e["rank"], e["node"], e["files"]) for e in everyone)
    try:
        problems = _check_share(shares.get(rank, []), files, mapped, everyone, opened["node"], rank)
    except Exception as e:  # reported like a damaged file: the others must not wait for this rank
        problems = [f"process {rank} could not verify its share ({type(e).__name__}: {e})"]
    results = _exchange(agree, problems, rank, path, "the exchange of the checksums' results")
    problems = [p for part in results for p in part]
    if problems:
        raise CheckpointCorruptError(
            describe_problems(
                f"Checkpoint {path} is corrupt; nothing of it was applied on any process "
                "(load an older checkpoint or save again):",
                problems,
            ),
            path=path,
            problems=problems,
        )
    return mapped
