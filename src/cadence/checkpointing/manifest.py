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
import sys
import time
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from .checksums import ALGORITHMS, xxhash_installed
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
    """xxh3_128 (several GB/s) when the optional `xxhash` package is installed, else sha256."""
    return "xxh3_128" if _xxhash_installed() else "sha256"


def new_hasher(algorithm: str):
    """A fresh hasher for `algorithm` (see cadence.checkpointing.checksums)."""
    if algorithm in ALGORITHMS and not checksum_available(algorithm):
        raise ValueError(
            f"Checksum algorithm {algorithm!r} needs the `xxhash` package: pip install xxhash."
        )
    return _new_hasher(algorithm)


def checksum_available(algorithm: str) -> bool:
    """True when `algorithm` is known and the package it needs is installed."""
    return algorithm in ALGORITHMS and (algorithm != "xxh3_128" or _xxhash_installed())


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


def read_manifest(directory: str | os.PathLike) -> Manifest:
    """The manifest of a checkpoint folder; a clear error when the save never finished."""
    directory = Path(directory)
    if not directory.is_dir():
        raise CheckpointIncompleteError(
            f"Checkpoint folder {directory} does not exist.", path=directory
        )
    path = manifest_path(directory)
    try:
        fd = open_member(directory, MANIFEST_NAME)
    except CheckpointIncompleteError:
        raise CheckpointIncompleteError(
            f"{directory} is not a complete checkpoint: it has no {MANIFEST_NAME}, which is "
            "written last when a save commits. The save that made it was interrupted, or the "
            "folder was not written by Cadence's save_state. Load another checkpoint or save again.",
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
