"""Reading a committed checkpoint, checking each file against the manifest before it is used.

Opening validates the manifest and checks every file's type and size, so a truncated, incomplete
or tampered-with checkpoint fails before anything is read. With verify="full", each file's checksum
is checked completely before any byte of it is deserialized (one pass over the file; safetensors
and weights-only files are then mapped, not copied). Load everything first, then check that each
state fits its object, then apply: nothing is applied half-way.

    with open_checkpoint(path) as ckpt:
        weights = ckpt.load_tensors("model.safetensors")   # checked, then mapped
        optim = ckpt.load_object("optimizer.bin")           # checked, then weights_only load
    model.load_state_dict(weights); optimizer.load_state_dict(optim)
"""

from __future__ import annotations

import io
import json
import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .atomic import recover_interrupted_commit
from .checksums import ALGORITHMS
from .errors import (
    CheckpointCorruptError,
    CheckpointError,
    CheckpointIncompleteError,
    describe_problems,
)
from .manifest import (
    MANIFEST_NAME,
    Manifest,
    VerifyMode,
    check_files,
    checksum_available,
    read_manifest,
)
from .safe_io import (
    check_member,
    hash_member,
    map_verified,
    open_member,
    read_bytes_verified,
    read_verified,
    resolve_member,
)
from .schema import check_member_name
from .serialization import read_torch
from .tensor_file import tensors_from_buffer

if TYPE_CHECKING:
    import torch

logger = logging.getLogger(__name__)


class CheckpointReader:
    """Files of one checkpoint folder, each read once and checked against the manifest before any
    byte of it is interpreted (see the module docstring)."""

    def __init__(self, path: Path, manifest: Manifest | None, verify: VerifyMode) -> None:
        self.path = path
        self.manifest = manifest
        self.verify_mode = verify

    # ---------------------------------------------------------------- files
    def has(self, name: str) -> bool:
        """True when the checkpoint holds file `name`."""
        if self.manifest is None:
            return (self.path / name).is_file()
        return name in self.manifest.files

    def names(self) -> list[str]:
        """Names of the checkpoint's files."""
        if self.manifest is None:
            return sorted(
                p.relative_to(self.path).as_posix() for p in self.path.rglob("*") if p.is_file()
            )
        return sorted(self.manifest.files)

    def _record(self, name: str) -> tuple[int | None, str | None, str | None]:
        """(size, checksum, algorithm) to check `name` against; raises when it is not listed."""
        if not self.has(name):
            raise CheckpointIncompleteError(
                f"Checkpoint {self.path} has no file {name!r}"
                + (f" (it holds: {', '.join(self.names())})" if self.manifest is not None else "")
                + ". Was it saved with the same models, optimizers and registered objects?",
                path=self.path,
                problems=[f"{name}: missing"],
            )
        if self.manifest is None:
            check_member_name(name)
            fd = open_member(self.path, name)
            try:
                return os.fstat(fd).st_size, None, None
            finally:
                os.close(fd)
        record = self.manifest.files[name]
        if self.verify_mode != "full":
            return record.size, None, None
        algorithm = self.manifest.checksum_algorithm
        if not checksum_available(algorithm):
            if algorithm not in ALGORITHMS:
                raise CheckpointCorruptError(
                    f"{self.path}: the manifest uses checksum algorithm {algorithm!r}, unknown to "
                    "this Cadence version; upgrade Cadence to verify it.",
                    path=self.path,
                )
            logger.warning(
                "%s was checksummed with %s, which needs the `xxhash` package (pip install "
                "xxhash); only sizes were verified.",
                self.path,
                algorithm,
            )
            return record.size, None, None
        return record.size, record.checksum, algorithm

    def file(self, name: str) -> Path:
        """Path of checkpoint file `name`, after checking it completely (verify='full'): for code
        that reads the file itself (engines, hooks)."""
        size, checksum, algorithm = self._record(name)
        if checksum is not None:
            actual = hash_member(self.path, name, size, algorithm)
            if actual != checksum:
                problem = (
                    f"{name}: content changed since the save ({algorithm} is {actual}, "
                    f"the manifest says {checksum})"
                )
                raise CheckpointCorruptError(
                    describe_problems(
                        f"Checkpoint {self.path} is corrupt; nothing from it should be used:",
                        [problem],
                    ),
                    path=self.path,
                    problems=[problem],
                )
        elif size is not None:
            check_member(self.path, name, size)
        return self.path / name

    def read_bytes(self, name: str) -> bytes:
        """The verified content of file `name`."""
        size, checksum, algorithm = self._record(name)
        return read_bytes_verified(self.path, name, size, checksum, algorithm)

    def read_json(self, name: str) -> Any:
        """File `name` parsed as JSON, after verification."""
        data = self.read_bytes(name)
        try:
            return json.loads(data.decode("utf-8"))
        except (ValueError, RecursionError) as e:
            raise CheckpointCorruptError(
                f"Checkpoint {self.path}: {name} is not valid JSON ({type(e).__name__}).",
                path=self.path,
                problems=[f"{name}: not valid JSON"],
            ) from None

    def load_object(
        self, name: str, map_location: Any = None, *, allow_pickle: bool = False, **kwargs: Any
    ) -> Any:
        """A torch.save'd object, read with weights_only=True unless `allow_pickle` (see read_torch).

        The whole file is checked first. With full unpickling it is then deserialized from the
        private copy that was checked, so code in a swapped file can never run.
        """

        if kwargs.get("weights_only") is False:
            allow_pickle = True
        size, checksum, algorithm = self._record(name)
        source = os.fspath(self.path / name)
        if allow_pickle or map_location not in (None, "cpu") or kwargs:
            data = read_bytes_verified(self.path, name, size, checksum, algorithm)
            if not allow_pickle:
                _check_torch_archive(io.BytesIO(data), size, source, self.path)
            return read_torch(
                io.BytesIO(data), map_location, allow_pickle=allow_pickle, source=source, **kwargs
            )
        # weights_only: map the checked file instead of copying it (a race can change data, never
        # run code, and every state is checked against its object before it is applied).
        fd_stat = _identity(self.path, name)
        self.file(name) if checksum is not None else check_member(self.path, name, size)
        with open(resolve_member(self.path, name), "rb") as f:
            _check_torch_archive(f, size, source, self.path)
        try:
            obj = read_torch(source, map_location, allow_pickle=False, source=source, mmap=True)
        except CheckpointError:
            raise
        except RuntimeError as e:
            if "mmap" not in str(e):
                raise CheckpointCorruptError(
                    f"Cannot read {source}: {e}", path=self.path, problems=[f"{name}: {e}"]
                ) from e
            # An old (non-zip) torch file cannot be mapped: read the checked bytes instead.
            data = read_bytes_verified(self.path, name, size, checksum, algorithm)
            return read_torch(io.BytesIO(data), map_location, source=source)
        except Exception as e:
            raise CheckpointCorruptError(
                f"Cannot read {source}: {e}", path=self.path, problems=[f"{name}: {e}"]
            ) from e
        if _identity(self.path, name) != fd_stat:
            raise CheckpointCorruptError(
                f"Checkpoint {self.path}: {name} was replaced while it was being loaded.",
                path=self.path,
            )
        return obj

    def load_tensors(self, name: str, device: str | int = "cpu") -> dict[str, torch.Tensor]:
        """A safetensors file as a dict of tensors (zero-copy views of the checked file on CPU)."""

        size, checksum, algorithm = self._record(name)
        buffer = map_verified(self.path, name, size, checksum, algorithm)
        if buffer is None:
            buffer = read_verified(self.path, name, size, checksum, algorithm)
        tensors, _ = tensors_from_buffer(buffer, os.fspath(self.path / name))
        if str(device) != "cpu":
            tensors = {k: v.to(device) for k, v in tensors.items()}
        return tensors

    # ---------------------------------------------------------------- finishing
    def finish(self) -> None:
        """Every file was checked before it was returned; kept for callers of earlier versions."""

    def close(self) -> None:
        """Nothing stays open between reads."""

    def __enter__(self) -> CheckpointReader:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _check_torch_archive(f: Any, size: int, source: str, directory: Path) -> None:
    """Refuse a torch file whose archive entries claim more bytes than the file holds.

    torch allocates each record at the size its zip entry declares; a checked but hostile file
    could otherwise ask for any amount of memory. torch writes records uncompressed, so no entry
    can be larger than the file. Files in torch's pre-1.6 (non-zip) format size their storages
    from the pickle and are refused unless fully unpickled by explicit opt-in.
    """
    import zipfile

    def bad(why: str) -> CheckpointCorruptError:
        return CheckpointCorruptError(
            f"Cannot read {source}: {why}", path=directory, problems=[f"{source}: {why}"]
        )

    try:
        with zipfile.ZipFile(f) as archive:
            entries = archive.infolist()
    except (zipfile.BadZipFile, ValueError, OSError, EOFError, RecursionError) as e:
        raise bad(
            f"not a zip-format torch file ({e}); files in torch's legacy format load only "
            "with allow_pickle=True"
        ) from None
    for info in entries:
        if info.compress_type != zipfile.ZIP_STORED:
            raise bad(f"archive entry {info.filename[:80]!r} is compressed; torch never does that")
        if info.file_size > size or info.header_offset + info.file_size > size:
            raise bad(f"archive entry {info.filename[:80]!r} claims more bytes than the file holds")


def _identity(directory: Path, name: str) -> tuple[int, int, int]:
    info = os.stat(resolve_member(directory, name))
    return info.st_dev, info.st_ino, info.st_size


def open_checkpoint(
    path: str | os.PathLike, *, verify: VerifyMode = "full", allow_unverified: bool = False
) -> CheckpointReader:
    """Open a checkpoint folder for loading.

    verify: "full" (sizes now, checksums of the files read, in the background), "sizes" or "none".
    allow_unverified: accept a folder without manifest (e.g. written by another tool) with a
    warning instead of the CheckpointIncompleteError.
    """
    path = Path(os.path.expanduser(os.fspath(path)))
    if not path.exists():
        recover_interrupted_commit(path)
    if not path.is_dir():
        raise CheckpointIncompleteError(
            f"Checkpoint folder {path} does not exist"
            + (" (it is a file)" if path.exists() else "")
            + ".",
            path=path,
        )
    if verify not in ("full", "sizes", "none"):
        raise ValueError(f"verify must be 'full', 'sizes' or 'none', got {verify!r}")
    try:
        manifest = read_manifest(path)
    except CheckpointIncompleteError:
        if not allow_unverified:
            raise
        logger.warning(
            "Loading %s without verification: it has no %s (not written by Cadence's save_state, "
            "or its save was interrupted).",
            path,
            MANIFEST_NAME,
        )
        return CheckpointReader(path, None, "none")
    if verify != "none":
        check_files(path, manifest, manifest.files, "sizes")
    return CheckpointReader(path, manifest, verify)
