"""Reading a committed checkpoint, checking each file against the manifest before it is used.

Opening validates the manifest and checks every file's type and size, so a truncated, incomplete
or tampered-with checkpoint fails before anything is read. With verify="full", each file's checksum
is checked before any byte of it is deserialized or handed out: each file is read once, hashed in
file order while it is read, its tensors straight into memory of their own (safetensors by their
header, torch files by their zip directory, see tensor_file and torch_file), and deserialized from
that memory once the checksum matched; so what is used is exactly what was verified, and nothing
maps or refers to the checkpoint's files after a load. `prefetch(names)` reads several files in
background threads; `open_file` gives engines that read a file object the verified bytes. Load
everything first, then check that each state fits its object, then apply: nothing is applied
half-way.

    with open_checkpoint(path) as ckpt:
        weights = ckpt.load_tensors("model.safetensors")   # read once, checked, then parsed
        optim = ckpt.load_object("optimizer.bin")           # checked, then weights_only load
    model.load_state_dict(weights); optimizer.load_state_dict(optim)
"""

from __future__ import annotations

import io
import json
import logging
import os
from concurrent.futures import Future, ThreadPoolExecutor
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
from .node_verify import MappedFile, count_hashed, verify_together
from .safe_io import (
    check_member,
    hash_member,
    open_member,
    read_bytes_verified,
    read_verified,
)
from .schema import check_member_name
from .serialization import BufferFile, read_torch_buffer
from .tensor_file import read_tensor_file, tensors_from_buffer
from .torch_file import SegmentedFile, read_torch_file

if TYPE_CHECKING:
    import torch

logger = logging.getLogger(__name__)

# Reading and hashing in C release the GIL: a few files at once use the cores and the disk.
_PREFETCH_THREADS = min(4, os.cpu_count() or 1)


class CheckpointReader:
    """Files of one checkpoint folder, each read once and checked against the manifest before any
    byte of it is interpreted (see the module docstring)."""

    def __init__(self, path: Path, manifest: Manifest | None, verify: VerifyMode) -> None:
        self.path = path
        self.manifest = manifest
        self.verify_mode = verify
        self._prefetched: dict[str, Future] = {}
        self._pool: ThreadPoolExecutor | None = None
        # Files verified together with the other ranks of this machine (verify_together).
        self._mapped: dict[str, MappedFile] = {}

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
        that can only read the file itself by its path (engines, hooks).

        The check is a pass of its own, and the engine's read that follows is not covered by it
        (a file rewritten in between would be read unverified); `open_file` hands over the very
        bytes that were verified, in one read, and is preferred wherever a file object will do.
        """
        size, checksum, algorithm = self._record(name)
        if checksum is not None:
            actual = hash_member(self.path, name, size, algorithm)
            count_hashed(size)
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

    def open_file(self, name: str) -> io.BufferedReader:
        """A read-only, seekable binary file of checkpoint file `name`'s verified content: the file
        is read once into private memory, hashed while it is read, and handed over only after its
        checksum matched, so what the caller reads is exactly what was verified and nothing refers
        to the checkpoint file afterwards (for engines that take a file object)."""
        return io.BufferedReader(self._whole_file(name).open())

    def read_bytes(self, name: str) -> bytes:
        """The verified content of file `name`."""
        mapped = self._mapped.get(name)
        if mapped is not None:
            return bytes(mapped.view())
        size, checksum, algorithm = self._record(name)
        return _counted(
            read_bytes_verified(self.path, name, size, checksum, algorithm), size, checksum
        )

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

    def prefetch(self, names: list[str]) -> None:
        """Start reading and verifying files `names` in background threads (reads and hashing in C
        release the GIL), so several files are verified in parallel while earlier ones are
        deserialized and applied. Errors are raised when the file is loaded."""
        for name in names:
            if name in self._prefetched or not self.has(name):
                continue
            if self._pool is None:
                self._pool = ThreadPoolExecutor(
                    max_workers=_PREFETCH_THREADS, thread_name_prefix="cadence-ckpt-read"
                )
            read = self._read_tensors if _is_tensor_file(name) else self._read_torch
            self._prefetched[name] = self._pool.submit(read, name)

    def _read_verified(self, name: str) -> Any:
        size, checksum, algorithm = self._record(name)
        return _counted(read_verified(self.path, name, size, checksum, algorithm), size, checksum)

    def _whole_file(self, name: str) -> SegmentedFile:
        """File `name` read and verified (by `prefetch`, or now) as a whole, not tensor by tensor."""
        future = self._prefetched.pop(name, None)
        if future is not None and not _is_tensor_file(name):
            return future.result()
        return self._read_torch(name)

    def _read_torch(self, name: str) -> SegmentedFile:
        size, checksum, algorithm = self._record(name)
        return _counted(read_torch_file(self.path, name, size, checksum, algorithm), size, checksum)

    def _read_tensors(self, name: str) -> dict[str, torch.Tensor]:
        size, checksum, algorithm = self._record(name)
        tensors = read_tensor_file(self.path, name, size, checksum, algorithm)[0]
        return _counted(tensors, size, checksum)

    def _buffer(self, name: str) -> Any:
        """The verified content of `name` in private memory (a uint8 tensor), read exactly once."""
        self._prefetched.pop(name, None)  # prefetched in another form: read again
        return self._read_verified(name)

    def load_object(
        self, name: str, map_location: Any = None, *, allow_pickle: bool = False, **kwargs: Any
    ) -> Any:
        """A torch.save'd object, read with weights_only=True unless `allow_pickle` (see read_torch).

        The file is read once into private memory and hashed while it is read; it is deserialized
        from that very memory after its checksum matched, so neither code nor data of a file
        swapped or rewritten meanwhile is ever used, and the tensors returned refer to no file.
        """

        if kwargs.get("weights_only") is False:
            allow_pickle = True
        mapped = self._mapped.get(name)
        data = mapped.tensor() if mapped is not None else self._whole_file(name)
        source = os.fspath(self.path / name)
        if not allow_pickle:
            if mapped is not None:
                _check_torch_archive(BufferFile(mapped.view()), mapped.size, source, self.path)
            else:
                _check_torch_archive(data.open(), data.size, source, self.path)
        return read_torch_buffer(
            data, map_location, source=source, allow_pickle=allow_pickle, **kwargs
        )

    def load_tensors(self, name: str, device: str | int = "cpu") -> dict[str, torch.Tensor]:
        """A safetensors file as a dict of tensors, each read from the file straight into its own
        memory and returned after the whole file's checksum matched (see read_tensor_file)."""

        future = self._prefetched.pop(name, None)
        mapped = self._mapped.get(name)
        if mapped is not None:  # verified with the other ranks: views of the mapping
            tensors, _ = tensors_from_buffer(mapped.tensor(), os.fspath(self.path / name))
        elif future is not None and _is_tensor_file(name):
            tensors = future.result()
        elif _is_tensor_file(name):
            tensors = self._read_tensors(name)
        else:  # another suffix: parsed from the verified whole-file buffer
            tensors, _ = tensors_from_buffer(self._buffer(name), os.fspath(self.path / name))
        if str(device) != "cpu":
            tensors = {k: v.to(device) for k, v in tensors.items()}
        return tensors

    # ---------------------------------------------------------------- shared verification
    def verify_together(
        self,
        names: list[str],
        rank: int,
        agree: Any,
        failure: CheckpointError | None = None,
    ) -> None:
        """Verify files `names` (what this rank will load) together with the other ranks of its
        machine, each hashing its share, and agree on the result (node_verify.verify_together: a
        collective, every rank calls it once). Afterwards `load_object` / `load_tensors` of these
        files cut their tensors out of the shared, verified mappings without reading them again."""
        files: dict[str, tuple[int, str | None, str | None]] = {}
        if failure is None:
            try:
                files = {name: self._record(name) for name in names}
            except CheckpointError as e:
                failure = e
        self._mapped = verify_together(self.path, files, rank, agree, failure)

    def check_unchanged(self) -> None:
        """Raise CheckpointCorruptError when a file verified together changed since (its identity:
        inode, size, times); called right before the loaded states are applied."""
        changed = [name for name, one in self._mapped.items() if not one.unchanged()]
        if changed:
            problems = [f"{name}: changed on disk during the load" for name in changed]
            raise CheckpointCorruptError(
                describe_problems(
                    f"Checkpoint {self.path} changed while it was loaded; nothing was applied:",
                    problems,
                ),
                path=self.path,
                problems=problems,
            )

    # ---------------------------------------------------------------- finishing
    def finish(self) -> None:
        """Every file was checked before it was returned; kept for callers of earlier versions."""

    def close(self) -> None:
        """Drop prefetched files nobody loaded (their reads finish in the background)."""
        for future in self._prefetched.values():
            future.cancel()
        self._prefetched.clear()
        for mapped in self._mapped.values():
            mapped.close()
        self._mapped = {}
        if self._pool is not None:
            self._pool.shutdown(wait=False)
            self._pool = None

    def __enter__(self) -> CheckpointReader:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _counted(result: Any, size: int, checksum: str | None) -> Any:
    """`result`, after counting the `size` bytes hashed for it (none without a checksum)."""
    if checksum is not None:
        count_hashed(size)
    return result


def _is_tensor_file(name: str) -> bool:
    """Files read tensor by tensor (safetensors) rather than into one buffer."""
    return name.endswith(".safetensors")


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
            # Accelerate's wording, so that scripts and tests matching it keep working.
            f"Tried to find {path} but folder does not exist"
            + (" (a file of that name does)" if path.exists() else ""),
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
