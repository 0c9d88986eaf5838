"""Opening and reading files of a checkpoint folder without trusting the folder.

Only regular files inside the folder are read: a FIFO, a device, a socket or a folder under a
listed name is refused (opened non-blocking, so a FIFO cannot stall the open), and so is a symlink
whose target leaves the checkpoint folder. Sizes are compared with the manifest on the open file
before reading, and reads never go past the declared size, so `/dev/zero` behind a name cannot make
a load run forever. `read_verified` reads a file once into private memory and checks its checksum
before anyone deserializes a byte of it.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

from .checksums import new_hasher
from .errors import CheckpointCorruptError, CheckpointIncompleteError

_KINDS = (
    (stat.S_ISDIR, "a folder"),
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)
_HASH_CHUNK = 64 * 1024 * 1024


def _kind(mode: int) -> str:
    for test, label in _KINDS:
        if test(mode):
            return label
    return "not a regular file"


def _corrupt(directory: Path, message: str) -> CheckpointCorruptError:
    return CheckpointCorruptError(
        f"Checkpoint {directory} cannot be loaded safely: {message}",
        path=directory,
        problems=[message],
    )


def resolve_member(directory: str | os.PathLike, name: str) -> str:
    """Real path of `name` inside `directory`; CheckpointCorruptError when it leads outside."""
    directory = Path(directory)
    root = os.path.realpath(directory)
    real = os.path.realpath(os.path.join(root, name))
    if real != root and os.path.commonpath([root, real]) == root:
        return real
    raise _corrupt(
        directory, f"{name}: resolves to {real}, outside the checkpoint folder (a symlink?)"
    )


def open_member(directory: str | os.PathLike, name: str, expected_size: int | None = None) -> int:
    """A read-only descriptor of regular file `name` of the folder, checked against `expected_size`."""
    directory = Path(directory)
    real = resolve_member(directory, name)
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    flags |= getattr(os, "O_NONBLOCK", 0)  # a FIFO must not block the open
    try:
        fd = os.open(real, flags)
    except FileNotFoundError:
        raise CheckpointIncompleteError(
            f"Checkpoint {directory} is incomplete: {name}: missing"
            + (f" (the manifest lists {expected_size} bytes)" if expected_size is not None else ""),
            path=directory,
            problems=[
                f"{name}: missing"
                + (
                    f" (the manifest lists {expected_size} bytes)"
                    if expected_size is not None
                    else ""
                )
            ],
        ) from None
    except OSError as e:
        raise _corrupt(directory, f"{name}: cannot be opened ({e.strerror})") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise _corrupt(directory, f"{name}: is {_kind(info.st_mode)}, not a regular file")
        if expected_size is not None and info.st_size != expected_size:
            kind = "truncated" if info.st_size < expected_size else "longer than saved"
            raise _corrupt(
                directory,
                f"{name}: {kind}: {info.st_size} bytes on disk, the manifest says {expected_size}",
            )
    except BaseException:
        os.close(fd)
        raise
    return fd


def check_member(directory: str | os.PathLike, name: str, expected_size: int) -> None:
    """Raise unless `name` is a regular file inside the folder with exactly `expected_size` bytes."""
    os.close(open_member(directory, name, expected_size))


def _read_exactly(fd: int, view: memoryview) -> int:
    got = 0
    total = len(view)
    while got < total:
        n = os.readv(fd, [view[got:]])
        if n == 0:
            break
        got += n
    return got


def _allocate(size: int) -> Any:
    """Uninitialised, writable memory of `size` bytes (a torch uint8 tensor when torch is loaded)."""
    try:
        import torch  # already imported by whoever deserializes checkpoint files

        return torch.empty(size, dtype=torch.uint8)
    except ImportError:
        return bytearray(size)


def buffer_view(buffer: Any) -> memoryview:
    """A byte memoryview of a buffer made by `read_verified`."""
    if isinstance(buffer, (bytes, bytearray)):
        return memoryview(buffer)
    return memoryview(buffer.numpy())


def read_verified(
    directory: str | os.PathLike,
    name: str,
    size: int,
    checksum: str | None,
    algorithm: str | None,
) -> Any:
    """Read file `name` once into private memory; raise CheckpointCorruptError unless it has `size`
    bytes and (when `checksum` is given) that checksum. Returns the buffer (a uint8 tensor or
    bytearray); nothing of the file is interpreted before its checksum matched."""
    directory = Path(directory)
    fd = open_member(directory, name, size)
    try:
        buffer = _allocate(size)
        view = buffer_view(buffer)
        got = _read_exactly(fd, view) if size else 0
        extra = os.read(fd, 1) if got == size else b""
    except OSError as e:
        raise _corrupt(directory, f"{name}: unreadable ({e.strerror})") from None
    finally:
        os.close(fd)
    if got != size or extra:
        raise _corrupt(directory, f"{name}: changed size while being read (is it being written?)")
    if checksum is not None and algorithm is not None:
        actual = hash_view(view, algorithm)
        if actual != checksum:
            raise _corrupt(
                directory,
                f"{name}: content changed since the save ({algorithm} is {actual}, "
                f"the manifest says {checksum})",
            )
    return buffer


def hash_view(view: memoryview, algorithm: str) -> str:
    """Checksum of bytes in memory."""
    hasher = new_hasher(algorithm)
    for start in range(0, len(view), _HASH_CHUNK):
        hasher.update(view[start : start + _HASH_CHUNK])
    return hasher.hexdigest()


def read_bytes_verified(
    directory: str | os.PathLike, name: str, size: int, checksum: str | None, algorithm: str | None
) -> bytes:
    """Like read_verified, into an immutable bytes object (what io.BytesIO can wrap without a copy)."""
    directory = Path(directory)
    fd = open_member(directory, name, size)
    try:
        parts = []
        got = 0
        while got < size:
            part = os.read(fd, min(size - got, 1 << 30))
            if not part:
                break
            parts.append(part)
            got += len(part)
        extra = os.read(fd, 1) if got == size else b""
    except OSError as e:
        raise _corrupt(directory, f"{name}: unreadable ({e.strerror})") from None
    finally:
        os.close(fd)
    if got != size or extra:
        raise _corrupt(directory, f"{name}: changed size while being read (is it being written?)")
    data = parts[0] if len(parts) == 1 else b"".join(parts)
    if checksum is not None and algorithm is not None:
        actual = hash_view(memoryview(data), algorithm)
        if actual != checksum:
            raise _corrupt(
                directory,
                f"{name}: content changed since the save ({algorithm} is {actual}, "
                f"the manifest says {checksum})",
            )
    return data


def map_verified(
    directory: str | os.PathLike, name: str, size: int, checksum: str | None, algorithm: str | None
) -> Any:
    """Check file `name` (one pass, bounded by `size`), then map the same open file copy-on-write
    and return it as a uint8 tensor: zero-copy loading. Pages are shared with the page cache until
    written; the file is never changed through the mapping."""
    import mmap

    import torch

    directory = Path(directory)
    fd = open_member(directory, name, size)
    try:
        if checksum is not None and algorithm is not None:
            actual = _hash_fd(directory, name, fd, size, algorithm)
            if actual != checksum:
                raise _corrupt(
                    directory,
                    f"{name}: content changed since the save ({algorithm} is {actual}, "
                    f"the manifest says {checksum})",
                )
        if size == 0:
            return torch.empty(0, dtype=torch.uint8)
        try:
            mapped = mmap.mmap(
                fd, size, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ | mmap.PROT_WRITE
            )
        except (OSError, ValueError, AttributeError):
            return None  # the caller reads instead
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return torch.frombuffer(mapped, dtype=torch.uint8)
    finally:
        os.close(fd)


def hash_member(directory: str | os.PathLike, name: str, size: int, algorithm: str) -> str:
    """Checksum of file `name` (regular, inside the folder, exactly `size` bytes), never reading
    past `size`."""
    directory = Path(directory)
    fd = open_member(directory, name, size)
    try:
        return _hash_fd(directory, name, fd, size, algorithm)
    finally:
        os.close(fd)


def _hash_mapped(fd: int, size: int, algorithm: str) -> str | None:
    """Checksum through a read-only shared mapping (no copy); None where mapping is impossible."""
    import mmap

    try:
        mapped = mmap.mmap(fd, size, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ)
    except (OSError, ValueError, AttributeError):
        return None
    with mapped:
        if hasattr(mapped, "madvise"):
            mapped.madvise(mmap.MADV_SEQUENTIAL)
        hasher = new_hasher(algorithm)
        view = memoryview(mapped)
        try:
            for start in range(0, size, _HASH_CHUNK):
                hasher.update(view[start : start + _HASH_CHUNK])
        finally:
            view.release()
        return hasher.hexdigest()


def _hash_fd(directory: Path, name: str, fd: int, size: int, algorithm: str) -> str:
    # A mapping avoids copying the file; like torch.load(mmap=True), it assumes nobody truncates
    # the file while it is read (that would end the process with SIGBUS, not corrupt a load).
    if size >= 1 << 20:
        digest = _hash_mapped(fd, size, algorithm)
        if digest is not None:
            return digest
    try:
        hasher = new_hasher(algorithm)
        buffer = bytearray(min(size, 8 << 20)) if size else bytearray()  # stays in the CPU cache
        chunk = memoryview(buffer)
        left = size
        while left:
            n = os.preadv(fd, [chunk[: min(left, len(buffer))]], size - left)
            if n == 0:
                raise _corrupt(directory, f"{name}: shorter than its size while read")
            hasher.update(chunk[:n])
            left -= n
        return hasher.hexdigest()
    except OSError as e:
        raise _corrupt(directory, f"{name}: unreadable ({e.strerror})") from None
