"""Verifying a checkpoint once per machine: the ranks of a machine that load the same files split
the checksums between them and agree on the result before any byte is used.

Every rank maps the files it needs (copy-on-write, `mmap`), so the ranks of a machine read the
same pages of the page cache and nothing is copied until a state is applied. The work is cut into
units: the pieces of a file whose manifest records checksums of pieces (checkpoints saved since
issue 46: 64 MiB each, see checksums.py), or the whole file (older checkpoints). Each unit that
several ranks of a machine need is hashed by one of them (`assign_shares`: the largest units
first, each to the rank of the machine that needs it and has the fewest bytes to hash so far, so
each rank hashes about 1/N of the bytes, give or take one piece); a file only one rank needs (its
RNG state, its shard) is hashed by that rank. While a rank hashes one unit, a thread of it maps
in the next (`MADV_POPULATE_READ`): on a machine whose page cache does not hold the files, the
ranks read the disk in parallel, each its own units, once in all. The ranks then exchange the
digests (`agree`, one gather over the process group), and every rank combines the pieces'
digests of every file into the file's checksum and compares it with the manifest's: a file that
failed fails the load on every rank, before anything is deserialized or applied. A rank that dies
meanwhile makes the exchange fail on the others, which raise `SharedVerificationError`.

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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .checksums import ALGORITHMS, WHOLE_FILE, combine_pieces, split_name
from .errors import (
    CheckpointCorruptError,
    CheckpointError,
    SharedVerificationError,
    describe_problems,
)
from .safe_io import open_member

# Hashed in slices of this size (one update call each).
_HASH_SLICE = 8 << 20
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

    def read_ahead(self, start: int = 0, stop: int | None = None) -> None:
        """Ask the kernel to start reading bytes [start, stop) into the page cache (a hint): on a
        node whose cache does not hold them, the disk works while earlier ones are hashed."""
        stop = self.size if stop is None else stop
        if stop > start and hasattr(os, "posix_fadvise") and self._fd >= 0:
            try:
                os.posix_fadvise(self._fd, start, stop - start, os.POSIX_FADV_WILLNEED)
            except OSError:
                pass  # a hint only: hashing reads the pages either way

    def populate(self, start: int, stop: int) -> None:
        """Map in the pages of bytes [start, stop) (`start` page-aligned) in one call, reading the
        ones the page cache lacks; a hint: hashing faults in whatever this did not."""
        if self._map is None or stop <= start:
            return
        try:
            if _MADV_POPULATE_READ is not None:
                self._map.madvise(_MADV_POPULATE_READ, start, stop - start)
            else:
                self._map.madvise(mmap.MADV_WILLNEED, start, stop - start)
        except (OSError, ValueError):
            pass  # older kernels: the hash's page faults read the pages

    def unchanged(self) -> bool:
        """Whether the file still has the identity it had when it was mapped."""
        return self._fd >= 0 and _identity(self._fd) == self.identity

    def hash(self, algorithm: str, start: int = 0, stop: int | None = None) -> bytes:
        """The digest (with `algorithm`, a whole-file one: see checksums.WHOLE_FILE) of bytes
        [start, stop) of the mapping, counted in `hashed_bytes`."""
        stop = self.size if stop is None else stop
        hasher = WHOLE_FILE[algorithm]()
        if self._map is not None and stop > start:
            view = memoryview(self._map)
            try:
                for at in range(start, stop, _HASH_SLICE):
                    hasher.update(view[at : min(at + _HASH_SLICE, stop)])
            finally:
                view.release()
        count_hashed(stop - start)
        return hasher.digest()

    def close(self) -> None:
        """Close the descriptor; the mapping lives as long as the tensors cut out of it."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


Unit = tuple[str, int, int]  # (file name, first byte, end): a piece of a file, or all of it


@dataclass(frozen=True)
class Need:
    """What one rank loads: its machine and the files it needs, with their sizes, and the piece
    size of those whose checksums are of pieces (the others are hashed whole)."""

    rank: int
    node: str
    files: dict[str, int]
    pieces: dict[str, int] = field(default_factory=dict)


def units_of(name: str, size: int, piece: int | None) -> list[Unit]:
    """The units a file is hashed in: its pieces, or (no piece size) the whole file."""
    if not piece or size <= piece:
        return [(name, 0, size)]
    return [(name, at, min(at + piece, size)) for at in range(0, size, piece)]


def assign_shares(needs: Iterable[Need]) -> dict[int, list[Unit]]:
    """Which units each rank hashes: every unit of every file a machine needs is hashed by exactly
    one of the ranks of that machine that need the file, the largest units first, each to the
    rank with the fewest bytes so far (ties: the lower rank), so the ranks' bytes differ by at
    most one unit where all need the same files. The same on every rank, given the same `needs`;
    each rank's units in file order."""
    by_node: dict[str, list[Need]] = {}
    for need in needs:
        by_node.setdefault(need.node, []).append(need)
    shares: dict[int, list[Unit]] = {}
    for ranks in by_node.values():
        load = {need.rank: 0 for need in ranks}
        sizes: dict[str, int] = {}
        pieces: dict[str, int] = {}
        needers: dict[str, list[int]] = {}
        for need in ranks:
            shares.setdefault(need.rank, [])
            for name, size in need.files.items():
                sizes[name] = max(size, sizes.get(name, 0))
                needers.setdefault(name, []).append(need.rank)
                if need.pieces.get(name):
                    pieces[name] = need.pieces[name]
        units = [u for name in sizes for u in units_of(name, sizes[name], pieces.get(name))]
        for unit in sorted(units, key=lambda u: (u[1] - u[2], u[0], u[1])):
            rank = min(needers[unit[0]], key=lambda r: (load[r], r))
            shares[rank].append(unit)
            load[rank] += unit[2] - unit[1]
    return {rank: sorted(units) for rank, units in shares.items()}


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


def _populate_ahead(units: list[Unit], mapped: dict[str, MappedFile]) -> Callable[[int], None]:
    """Start a thread that maps in `units` one after the other; returns `wait(i)`, which returns
    once unit i is mapped in (or the thread gave up: hashing reads what is missing), and stops
    the thread when called with -1."""
    done = [threading.Event() for _ in units]
    stop = threading.Event()

    def run() -> None:
        try:
            for i, (name, start, end) in enumerate(units):
                if stop.is_set():
                    return
                mapped[name].populate(start, end)
                done[i].set()
        finally:
            for event in done:
                event.set()

    if len(units) <= 1:  # nothing to overlap with: the hash maps it in
        for i, (name, start, end) in enumerate(units):
            mapped[name].populate(start, end)
            done[i].set()
    else:
        threading.Thread(target=run, name="cadence-ckpt-populate", daemon=True).start()

    def wait(i: int) -> None:
        if i < 0:
            stop.set()
        else:
            done[i].wait()

    return wait


def _check_share(
    units: list[Unit],
    files: dict[str, tuple[int, str | None, str | None]],
    mapped: dict[str, MappedFile],
    everyone: list[dict],
    node: str,
    rank: int,
) -> tuple[list[str], dict[str, dict[int, str]]]:
    """Hash `units` (this rank's share); the problems found, and the digests (hex) of the units
    hashed, by file and first byte."""
    problems: list[str] = []
    digests: dict[str, dict[int, str]] = {}
    hashed = [u for u in units if files[u[0]][1] is not None and files[u[0]][2] is not None]
    for name, start, end in hashed:
        mapped[name].read_ahead(start, end)
    wait = _populate_ahead(hashed, mapped)
    try:
        for i, (name, start, end) in enumerate(hashed):
            wait(i)
            base, _ = split_name(files[name][2])
            digests.setdefault(name, {})[start] = mapped[name].hash(base, start, end).hex()
    finally:
        wait(-1)
    for name in dict.fromkeys(u[0] for u in units):
        one = mapped[name]
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
    return problems, digests


def _judge(everyone: list[dict], results: list[dict]) -> list[str]:
    """Every file of every machine against the manifest: its checksum made of the digests the
    ranks of its machine reported (the same answer on every rank, from the same gathered data)."""
    problems: list[str] = []
    nodes: dict[str, list[int]] = {}
    for i, entry in enumerate(everyone):
        nodes.setdefault(entry["node"], []).append(i)
    for indexes in nodes.values():
        expected: dict[str, tuple[int, str, str]] = {}
        for i in indexes:
            for name, record in everyone[i]["expect"].items():
                if expected.setdefault(name, tuple(record)) != tuple(record):
                    problems.append(
                        f"{name}: the processes read different manifests for it (was the "
                        "checkpoint replaced during the load?)"
                    )
        for name, (size, checksum, algorithm) in sorted(expected.items()):
            found: dict[int, str] = {}
            by: set[int] = set()
            for i in indexes:
                part = results[i]["digests"].get(name, {})
                found.update(part)
                by |= {everyone[i]["rank"]} if part else set()
            base, piece = split_name(algorithm)
            starts = [u[1] for u in units_of(name, size, piece)]
            if sorted(found) != starts:
                if not any(results[i]["problems"] for i in indexes):
                    missing = len(set(starts) - set(found))
                    problems.append(f"{name}: {missing} of its {len(starts)} parts went unverified")
                continue
            if piece is None:
                actual = found[0]
            else:
                actual = combine_pieces(WHOLE_FILE[base], [bytes.fromhex(found[s]) for s in starts])
            if actual != checksum:
                problems.append(
                    f"{name}: content changed since the save ({algorithm} is {actual}, the "
                    f"manifest says {checksum}; hashed by process"
                    f"{'es' if len(by) > 1 else ''} {', '.join(map(str, sorted(by)))})"
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
        # what each file must hash to (files without a checksum to check are not listed)
        "expect": {
            n: (size, checksum, algorithm)
            for n, (size, checksum, algorithm) in files.items()
            if checksum is not None and algorithm in ALGORITHMS and n in mapped
        },
    }
    opened["pieces"] = {n: split_name(record[2])[1] for n, record in opened["expect"].items()}
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
    shares = assign_shares(
        Need(e["rank"], e["node"], e["files"], {n: p for n, p in e["pieces"].items() if p})
        for e in everyone
    )
    digests: dict[str, dict[int, str]] = {}
    try:
        problems, digests = _check_share(
            shares.get(rank, []), files, mapped, everyone, opened["node"], rank
        )
    except Exception as e:  # reported like a damaged file: the others must not wait for this rank
        problems = [f"process {rank} could not verify its share ({type(e).__name__}: {e})"]
    mine = {"problems": problems, "digests": digests}
    results = _exchange(agree, mine, rank, path, "the exchange of the checksums' results")
    problems = [p for part in results for p in part["problems"]] + _judge(everyone, results)
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
