"""The manifest of a committed checkpoint, and checking a folder against it.

`cadence_manifest.json` is written last, after every file is on disk, so it doubles as the commit
marker: a folder without it never finished saving. It lists every file with its size and checksum,
plus the versions and world size that wrote it. `verify` compares a folder with its manifest, either
cheaply (presence and sizes: catches truncation and missing files) or fully (checksums too: catches
flipped bytes).
"""

from __future__ import annotations

import json
import logging
import mmap
import os
import re
import sys
import time
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from .checksums import ALGORITHMS, xxhash_installed
from .checksums import checksum_available as _checksum_available
from .checksums import default_checksum as _default_checksum
from .checksums import new_hasher as _new_hasher
from .errors import (
    CheckpointCorruptError,
    CheckpointError,
    CheckpointIncompleteError,
    describe_problems,
)
from .safe_io import check_member, hash_member, open_member
from .schema import (
    MAX_MANIFEST_BYTES,
    ManifestSchemaError,
    parse_manifest_json,
    validate_manifest,
)

MANIFEST_NAME = "cadence_manifest.json"
# Each rank's own record of the files it wrote: a file-level union of per-worker folders (Ray's merge)
# never collides on it, and the union of all of them is the whole checkpoint.
RANK_MANIFEST_RE = re.compile(r"^cadence_manifest\.rank(\d{1,8})\.json$")
FORMAT_NAME = "cadence-checkpoint"
FORMAT_VERSION = 1
VerifyMode = Literal["full", "sizes", "none"]

logger = logging.getLogger(__name__)

_CHUNK = 64 * 1024 * 1024


# Kept importable from here for callers of earlier versions.
_ALGORITHMS = ALGORITHMS


def _xxhash_installed() -> bool:
    return xxhash_installed()


def default_checksum() -> str:
    """xxh3_128 (several GB/s) when the `xxhash` package is installed, else sha256, over pieces of
    64 MiB (see cadence.checkpointing.checksums)."""
    return _default_checksum(_xxhash_installed())


def new_hasher(algorithm: str):
    """A fresh hasher for `algorithm` (see cadence.checkpointing.checksums)."""
    if algorithm in ALGORITHMS and not checksum_available(algorithm):
        raise ValueError(
            f"Checksum algorithm {algorithm!r} needs the `xxhash` package: pip install xxhash."
        )
    return _new_hasher(algorithm)


def checksum_available(algorithm: str) -> bool:
    """True when `algorithm` is known and the package it needs is installed."""
    return _checksum_available(algorithm, _xxhash_installed())


@dataclass(frozen=True)
class FileRecord:
    """Size in bytes and checksum (hex digest) of one file."""

    size: int
    checksum: str


def _map_for_reading(fd: int) -> mmap.mmap:
    if os.name == "posix":
        # MAP_POPULATE maps every page in one go instead of one fault per few pages.
        flags = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)
        return mmap.mmap(fd, 0, flags=flags, prot=mmap.PROT_READ)
    return mmap.mmap(fd, 0, access=mmap.ACCESS_READ)


def describe_file(path: str | os.PathLike, algorithm: str = "sha256") -> FileRecord:
    """Size and checksum of a file, reading it once."""
    hasher = new_hasher(algorithm)
    size = 0
    with open(path, "rb", buffering=0) as f:
        total = os.fstat(f.fileno()).st_size
        if total > 0:
            try:
                # Hashing straight from the page cache skips a copy per byte.
                with _map_for_reading(f.fileno()) as mapped:
                    view = memoryview(mapped)
                    try:
                        for start in range(0, total, _CHUNK):
                            hasher.update(view[start : start + _CHUNK])
                    finally:
                        view.release()
                return FileRecord(total, hasher.hexdigest())
            except (OSError, ValueError):
                hasher = new_hasher(algorithm)
        buffer = bytearray(min(_CHUNK, max(total, 4096)))
        view = memoryview(buffer)
        while True:
            n = f.readinto(buffer)
            if not n:
                break
            hasher.update(view[:n])
            size += n
    return FileRecord(size, hasher.hexdigest())


def _package_version(name: str) -> str:
    module = sys.modules.get(name)
    if module is not None and isinstance(getattr(module, "__version__", None), str):
        return module.__version__
    try:
        from importlib.metadata import version

        return version(name)
    except Exception:
        return "unknown"


@dataclass
class Manifest:
    """The record of a checkpoint's files and checksums, written last to mark it complete."""

    files: dict[str, FileRecord]
    checksum_algorithm: str = "sha256"
    world_size: int = 1
    ranks: list[int] = field(default_factory=lambda: [0])
    created: float = field(default_factory=time.time)
    cadence_version: str = field(default_factory=lambda: _package_version("cadence"))
    torch_version: str = field(default_factory=lambda: _package_version("torch"))
    metadata: dict[str, Any] = field(default_factory=dict)
    format_version: int = FORMAT_VERSION
    # Which rank wrote each file (from the per-rank manifests; empty for a single-manifest folder).
    owners: dict[str, int] = field(default_factory=dict, compare=False)

    def to_json(self) -> str:
        """The manifest as JSON text."""
        data = {
            "format": FORMAT_NAME,
            "format_version": self.format_version,
            "created": self.created,
            "created_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.created)),
            "cadence_version": self.cadence_version,
            "torch_version": self.torch_version,
            "world_size": self.world_size,
            "ranks": self.ranks,
            "checksum_algorithm": self.checksum_algorithm,
            "metadata": self.metadata,
            "files": {
                name: {"size": rec.size, "checksum": rec.checksum}
                for name, rec in sorted(self.files.items())
            },
        }
        return json.dumps(data, indent=1) + "\n"

    @classmethod
    def from_json(cls, text: str, source: str | os.PathLike) -> Manifest:
        """Parse and validate manifest text; CheckpointCorruptError for anything malformed."""
        try:
            version, records, other = validate_manifest(
                parse_manifest_json(text), FORMAT_NAME, FORMAT_VERSION
            )
        except ManifestSchemaError as e:
            raise CheckpointCorruptError(
                f"The checkpoint manifest {source} is unreadable ({e}). The checkpoint cannot be "
                "trusted; load an older checkpoint or save again.",
                path=Path(source).parent,
                problems=[f"{MANIFEST_NAME}: {e}"],
            ) from None
        files = {name: FileRecord(size, checksum) for name, (size, checksum) in records.items()}
        return cls(files=files, format_version=version, **other)


def manifest_path(directory: str | os.PathLike) -> Path:
    """Path of the manifest file in `directory`."""
    return Path(directory) / MANIFEST_NAME


def rank_manifest_name(rank: int) -> str:
    """File name of the record of the files rank `rank` wrote into a checkpoint."""
    return f"cadence_manifest.rank{rank}.json"


def is_manifest_name(name: str) -> bool:
    """True for the names the format reserves for manifests (the folder's and the ranks')."""
    return name == MANIFEST_NAME or RANK_MANIFEST_RE.match(name) is not None


def read_manifest(directory: str | os.PathLike) -> Manifest:
    """The manifest of a checkpoint folder; a clear error when the save never finished.

    `cadence_manifest.json` marks the folder committed. When the folder also holds per-rank
    manifests (`cadence_manifest.rank<r>.json`, written since checkpoints compose), the result is
    their union: every file of every rank, the saved world size, and which rank wrote what; a rank
    of the saved world without its manifest is an error naming it. Older folders (one manifest
    only) are read as they were written.
    """
    directory = Path(directory)
    try:
        names = [n for n in os.listdir(directory) if RANK_MANIFEST_RE.match(n)]
    except OSError:
        names = []
    if not names:
        return _read_one(directory, MANIFEST_NAME)
    # A per-worker folder without rank 0 has no folder manifest (see AtomicCheckpointWriter.commit):
    # its per-rank manifests are its record, and alone it is reported as missing rank 0's part.
    # Wherever rank 0's part is, the folder manifest must be too: it marks that commit complete.
    holds_rank0 = rank_manifest_name(0) in names
    top = (
        _read_one(directory, MANIFEST_NAME)
        if holds_rank0 or (directory / MANIFEST_NAME).exists()
        else None
    )
    whole = compose_rank_manifests(directory, [_read_one(directory, n) for n in sorted(names)])
    if top is not None:
        # The folder's manifest comes from the same commit as the per-rank ones of its ranks:
        # every file it lists is checked against it too (after a merge of per-worker folders it
        # is rank 0's folder's).
        whole.files.update(top.files)
    return whole


def compose_rank_manifests(directory: Path, parts: list[Manifest]) -> Manifest:
    """One manifest from the per-rank ones of a folder; refuses parts that do not make a whole."""
    problems: list[str] = []
    first = parts[0]
    world, algorithm = first.world_size, first.checksum_algorithm
    token = first.metadata.get("save")
    owners: dict[str, int] = {}
    files: dict[str, FileRecord] = {}
    ranks: set[int] = set()
    for part in parts:
        rank = part.ranks[0] if len(part.ranks) == 1 else None
        if rank is None:
            problems.append(f"a per-rank manifest lists ranks {part.ranks}, not one rank")
            continue
        label = rank_manifest_name(rank)
        if part.world_size != world or part.checksum_algorithm != algorithm:
            problems.append(
                f"{label}: written by a save on {part.world_size} processes with "
                f"{part.checksum_algorithm}, another part by one on {world} with {algorithm}"
            )
        if part.metadata.get("save") != token:
            problems.append(f"{label}: belongs to another save than the other ranks' parts")
        ranks.add(rank)
        for name, record in part.files.items():
            if name in files and files[name] != record:
                problems.append(f"{name}: recorded differently by ranks {owners[name]} and {rank}")
            files[name] = record
            owners.setdefault(name, rank)
    if not problems:
        for rank in sorted(set(range(world)) - ranks):
            problems.append(
                f"rank {rank}: its part is missing ({rank_manifest_name(rank)} and its files, "
                f"such as random_states_{rank}.pkl); the checkpoint was saved on {world} processes"
            )
        if problems:
            raise CheckpointIncompleteError(
                describe_problems(
                    f"Checkpoint {directory} is incomplete: the state of some ranks is missing "
                    "(when each process saved into its own folder, copy every folder into one):",
                    problems,
                ),
                path=directory,
                problems=problems,
            )
    if problems:
        raise CheckpointCorruptError(
            describe_problems(f"Checkpoint {directory} mixes parts that do not fit:", problems),
            path=directory,
            problems=problems,
        )
    rank0 = next(p for p in parts if p.ranks == [0])
    return Manifest(
        files=files,
        checksum_algorithm=algorithm,
        world_size=world,
        ranks=sorted(ranks),
        created=rank0.created,
        cadence_version=rank0.cadence_version,
        torch_version=rank0.torch_version,
        metadata=dict(rank0.metadata),
        owners=owners,
    )


def rank_manifests(
    files: dict[str, FileRecord], owners: dict[str, int], ranks: Iterable[int], **fields: Any
) -> dict[str, Manifest]:
    """{file name: manifest} of each rank's own files (`owners`: file -> rank), for the commit."""
    by_rank: dict[int, dict[str, FileRecord]] = {r: {} for r in ranks}
    for name, record in files.items():
        by_rank.setdefault(owners[name], {})[name] = record
    return {
        rank_manifest_name(r): Manifest(files=own, ranks=[r], **fields)
        for r, own in by_rank.items()
    }


def _read_one(directory: Path, member: str) -> Manifest:
    """One manifest file of `directory`, validated."""
    if not directory.is_dir():
        # Accelerate's wording, so that scripts and tests matching it keep working.
        raise CheckpointIncompleteError(
            f"Tried to find {directory} but folder does not exist", path=directory
        )
    path = directory / member
    try:
        fd = open_member(directory, member)
    except CheckpointIncompleteError:
        if member != MANIFEST_NAME:
            raise
        raise CheckpointIncompleteError(
            f"{directory} is not a complete checkpoint: it has no {MANIFEST_NAME}, which is "
            "written last when a save commits. The save that made it was interrupted, or the "
            "folder was not written by Cadence's save_state. Load another checkpoint or save again; "
            "a checkpoint Accelerate's save_state wrote loads without verification with "
            "load_state(..., allow_unverified=True) or CADENCE_LOAD_UNVERIFIED=1.",
            path=directory,
            problems=[f"{MANIFEST_NAME}: missing"],
        ) from None
    try:
        with os.fdopen(fd, "rb") as f:
            data = f.read(MAX_MANIFEST_BYTES + 1)  # bounded: a huge manifest is refused
    except OSError as e:
        raise CheckpointCorruptError(
            f"The checkpoint manifest {path} is unreadable ({e.strerror}).", path=directory
        ) from None
    if len(data) > MAX_MANIFEST_BYTES:
        raise CheckpointCorruptError(
            f"The checkpoint manifest {path} is larger than {MAX_MANIFEST_BYTES} bytes; it cannot "
            "be a manifest written by Cadence.",
            path=directory,
            problems=[f"{MANIFEST_NAME}: too large"],
        )
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise CheckpointCorruptError(
            f"The checkpoint manifest {path} is not valid UTF-8 text.",
            path=directory,
            problems=[f"{MANIFEST_NAME}: {e}"],
        ) from None
    return Manifest.from_json(text, path)


def _size_problem(directory: Path, name: str, record: FileRecord) -> tuple[str, bool] | None:
    """(description, is_missing) when the file is missing, not a regular file inside the folder,
    or has the wrong size."""
    try:
        check_member(directory, name, record.size)
    except CheckpointIncompleteError:
        return f"{name}: missing (the manifest lists {record.size} bytes)", True
    except CheckpointError as e:
        return (e.problems[0] if e.problems else str(e)), False
    return None


def _checksum_problem(directory: Path, name: str, record: FileRecord, algorithm: str) -> str | None:
    try:
        actual = hash_member(directory, name, record.size, algorithm)
    except CheckpointError as e:
        return e.problems[0] if e.problems else str(e)
    if actual != record.checksum:
        return (
            f"{name}: content changed since the save ({algorithm} is {actual}, "
            f"the manifest says {record.checksum})"
        )
    return None


def check_files(
    directory: str | os.PathLike,
    manifest: Manifest,
    names: Iterable[str],
    mode: VerifyMode = "full",
    max_workers: int = 2,
) -> None:
    """Check the given files of a checkpoint against its manifest; raise one error naming all problems."""
    directory = Path(directory)
    if mode == "none":
        return
    if mode not in ("full", "sizes"):
        raise ValueError(f"verify mode must be 'full', 'sizes' or 'none', got {mode!r}")
    names = list(names)
    problems: list[str] = []
    missing = False
    for name in names:
        record = manifest.files.get(name)
        if record is None:
            problems.append(f"{name}: not part of this checkpoint (absent from {MANIFEST_NAME})")
            missing = True
            continue
        found = _size_problem(directory, name, record)
        if found is not None:
            problems.append(found[0])
            missing |= found[1]
    if not problems and mode == "full":
        algorithm = manifest.checksum_algorithm
        if algorithm not in _ALGORITHMS:
            raise CheckpointCorruptError(
                f"{directory}: the manifest uses checksum algorithm {algorithm!r}, unknown to "
                "this Cadence version; upgrade Cadence to verify it.",
                path=directory,
            )
        if not checksum_available(algorithm):
            logger.warning(
                "%s was checksummed with %s, which needs the `xxhash` package (pip install "
                "xxhash); only file presence and sizes were verified.",
                directory,
                algorithm,
            )
            return

        def check(name: str) -> str | None:
            return _checksum_problem(directory, name, manifest.files[name], algorithm)

        if len(names) <= 1 or max_workers <= 1:
            found_all = [check(n) for n in names]
        else:
            with ThreadPoolExecutor(max_workers=max_workers) as pool:
                found_all = list(pool.map(check, names))
        problems = [p for p in found_all if p is not None]
    if problems:
        error = CheckpointIncompleteError if missing else CheckpointCorruptError
        raise error(
            describe_problems(
                f"Checkpoint {directory} failed verification; it cannot be loaded safely:", problems
            ),
            path=directory,
            problems=problems,
        )


def verify(directory: str | os.PathLike, mode: VerifyMode = "full") -> Manifest:
    """Check a whole checkpoint folder against its manifest and return the manifest.

    mode "sizes" checks that every listed file is present with the listed size (a stat per file);
    "full" also recomputes every checksum. Raises CheckpointIncompleteError (manifest or a file
    missing) or CheckpointCorruptError (wrong size, wrong checksum, unreadable manifest).
    """
    manifest = read_manifest(directory)
    check_files(directory, manifest, manifest.files, mode)
    return manifest


def is_complete(directory: str | os.PathLike, mode: VerifyMode = "sizes") -> bool:
    """True when the folder holds a committed checkpoint that passes `verify(directory, mode)`."""
    try:
        verify(directory, mode)
    except (CheckpointIncompleteError, CheckpointCorruptError):
        return False
    return True
