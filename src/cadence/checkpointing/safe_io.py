"""Opening and reading files of a checkpoint folder without trusting the folder.

Only regular files inside the folder are read: a FIFO, a device, a socket or a folder under a
listed name is refused (opened non-blocking, so a FIFO cannot stall the open), and so is a symlink
whose target leaves the checkpoint folder. Sizes are compared with the manifest on the open file
before reading, and reads never go past the declared size, so `/dev/zero` behind a name cannot make
a load run forever. `read_verified` reads a file once into private memory, hashing it while it is
read, and checks its checksum before anyone deserializes a byte of it: what is deserialized is
exactly what was verified, and nothing refers to the file afterwards.
"""

from __future__ import annotations

import io
import os
import queue
import stat
import threading
from collections.abc import Iterator
from contextlib import contextmanager
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


def corrupt(directory: Path, message: str) -> CheckpointCorruptError:
    """The error for a checkpoint file that cannot be loaded safely, and why."""
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
    raise corrupt(
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
        raise corrupt(directory, f"{name}: cannot be opened ({e.strerror})") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise corrupt(directory, f"{name}: is {_kind(info.st_mode)}, not a regular file")
        if expected_size is not None and info.st_size != expected_size:
            kind = "truncated" if info.st_size < expected_size else "longer than saved"
            raise corrupt(
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


def read_exactly(fd: int, view: memoryview) -> int:
    """Read from `fd`'s position until `view` is full or the file ends; the bytes read."""
    got = 0
    total = len(view)
    while got < total:
        n = os.readv(fd, [view[got:]])
        if n == 0:
            break
        got += n
    return got


_HASHED_PIECE = 8 << 20  # hashed right after it is read, while it is still in the CPU cache


def read_hashed(fd: int, view: memoryview, hasher: Any) -> int:
    """Fill `view` from `fd`'s position piece by piece, each piece hashed (`hasher`, or None) right
    after it is read; the bytes read (fewer than len(view) when the file ended)."""
    done = 0
    while done < len(view):
        piece = view[done : done + _HASHED_PIECE]
        got = read_exactly(fd, piece)
        if hasher is not None:
            hasher.update(piece[:got])
        done += got
        if got < len(piece):
            break
    return done


def _allocate(size: int) -> Any:
    """Uninitialised, writable memory of `size` bytes (a torch uint8 tensor when torch is loaded).

    Ordinary pages on purpose: huge pages (an anonymous mapping with MADV_HUGEPAGE) fill 5x faster
    when the memory was recently used, but on a VM whose free memory is handed back to the host
    (free page reporting) a fresh process pays the host for every huge page: measured on the
    development VM, a resume in a new process took 2.2 s of CPU with huge pages, 0.74 s without.
    """
    try:
        import torch  # already imported by whoever deserializes checkpoint files

        return torch.empty(size, dtype=torch.uint8)
    except ImportError:
        return bytearray(size)


class RandomAccessFile(io.RawIOBase):
    """Base of the read-only, seekable files of `size` bytes that checkpoint reading serves from
    memory or a descriptor; a subclass fills `readinto` from position `_pos`."""

    def __init__(self, size: int) -> None:
        super().__init__()
        self._size, self._pos = size, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._size}[whence]
        self._pos = max(0, base + offset)
        return self._pos


@contextmanager
def reading_member(directory: Path, name: str, size: int) -> Iterator[int]:
    """A descriptor of checkpoint file `name` (a regular file of `size` bytes inside `directory`),
    closed afterwards; an OSError while it is read becomes a CheckpointCorruptError naming it."""
    fd = open_member(directory, name, size)
    try:
        yield fd
    except OSError as e:
        raise corrupt(directory, f"{name}: unreadable ({e.strerror})") from None
    finally:
        os.close(fd)


def ends_at(fd: int, size: int) -> bool:
    """Whether the file of `fd` has no byte at offset `size` (it did not grow while it was read)."""
    return os.pread(fd, 1, size) == b""


def check_read(
    directory: Path,
    name: str,
    complete: bool,
    actual: str | None,
    checksum: str | None,
    algorithm: str | None,
) -> None:
    """Raise CheckpointCorruptError unless the file was read to exactly its size (`complete`) and,
    when its digest was computed (`actual`), that digest is `checksum`."""
    if not complete:
        raise corrupt(directory, f"{name}: changed size while being read (is it being written?)")
    if actual is not None and actual != checksum:
        raise corrupt(
            directory,
            f"{name}: content changed since the save ({algorithm} is {actual}, "
            f"the manifest says {checksum})",
        )


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
    bytearray); nothing of the file is interpreted before its checksum matched.

    The checksum is computed from the very bytes read into the buffer, chunk by chunk by a second
    thread while the next chunk is read (hashing in C releases the GIL): the file is read once,
    and a file rewritten on disk after this read cannot reach the caller unverified.
    """
    directory = Path(directory)
    hashing = checksum is not None and algorithm is not None
    with reading_member(directory, name, size) as fd:
        buffer = _allocate(size)
        view = buffer_view(buffer)
        if hashing:
            got, actual = _read_hashing(fd, view, algorithm)
        else:
            got, actual = (read_exactly(fd, view) if size else 0), None
        complete = got == size and ends_at(fd, size)
    check_read(directory, name, complete, actual, checksum, algorithm)
    return buffer


_PIPELINE_CHUNK = 8 << 20  # small enough to be hashed from the CPU cache right after the read
# Threads reading one large file at once: filling fresh memory (page faults) costs more than reading
# or hashing it, and it scales with cores; the checksum still goes through the chunks in order.
_READERS = min(4, os.cpu_count() or 1)


def _read_hashing(fd: int, view: memoryview, algorithm: str) -> tuple[int, str]:
    """Fill `view` from `fd` while the bytes already read are hashed, in order, as they arrive.

    Returns (bytes read, hex digest of exactly those bytes)."""
    total = len(view)
    if total <= 2 * _PIPELINE_CHUNK:  # small: a thread costs more than it saves
        hasher = new_hasher(algorithm)
        got = read_exactly(fd, view) if total else 0
        hasher.update(view[:got])
        return got, hasher.hexdigest()
    readers = max(1, min(_READERS, total // (4 * _PIPELINE_CHUNK)))
    if readers == 1:
        return _read_then_hash(fd, view, algorithm)
    return _read_parallel(fd, view, algorithm, readers)


def _read_then_hash(fd: int, view: memoryview, algorithm: str) -> tuple[int, str]:
    """One thread reads chunk after chunk, a second hashes each as soon as it is read."""
    hasher = new_hasher(algorithm)
    total = len(view)
    chunks: queue.SimpleQueue = queue.SimpleQueue()
    failure: list[BaseException] = []

    def consume() -> None:
        while True:
            chunk = chunks.get()
            if chunk is None:
                return
            if not failure:
                try:
                    hasher.update(chunk)
                except BaseException as e:  # re-raised by the reader below
                    failure.append(e)

    thread = threading.Thread(target=consume, name="cadence-ckpt-verify", daemon=True)
    thread.start()
    got = 0
    try:
        while got < total:
            n = os.readv(fd, [view[got : min(total, got + _PIPELINE_CHUNK)]])
            if n == 0:
                break
            chunks.put(view[got : got + n])
            got += n
    finally:
        chunks.put(None)
        thread.join()
    if failure:
        raise failure[0]
    return got, hasher.hexdigest()


def _read_parallel(fd: int, view: memoryview, algorithm: str, readers: int) -> tuple[int, str]:
    """`readers` threads read interleaved chunks (pread: no shared file position); this thread
    hashes the chunks in file order as each one is complete. A chunk that comes back short (the
    file shrank) ends the read: the caller reports the size."""
    total = len(view)
    starts = range(0, total, _PIPELINE_CHUNK)
    count = len(starts)
    filled = [0] * count
    ready = [threading.Event() for _ in range(count)]
    stop = threading.Event()
    failure: list[BaseException] = []

    def read_part(first: int) -> None:
        try:
            for i in range(first, count, readers):
                if stop.is_set():
                    return
                start = starts[i]
                end = min(total, start + _PIPELINE_CHUNK)
                position = start
                while position < end:
                    n = os.preadv(fd, [view[position:end]], position)
                    if n == 0:
                        break
                    position += n
                filled[i] = position - start
                ready[i].set()
                if position < end:
                    return
        except BaseException as e:  # re-raised by the hashing thread below
            failure.append(e)
        finally:
            for i in range(first, count, readers):  # never leave the hashing thread waiting
                ready[i].set()

    threads = [
        threading.Thread(target=read_part, args=(k,), name="cadence-ckpt-read", daemon=True)
        for k in range(readers)
    ]
    for thread in threads:
        thread.start()
    hasher = new_hasher(algorithm)
    got = 0
    try:
        for i in range(count):
            ready[i].wait()
            if failure:
                break
            got += filled[i]
            hasher.update(view[starts[i] : starts[i] + filled[i]])
            if filled[i] < min(_PIPELINE_CHUNK, total - starts[i]):
                break  # short: the file changed size
    finally:
        stop.set()
        for thread in threads:
            thread.join()
    if failure:
        raise failure[0]
    return got, hasher.hexdigest()


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
        raise corrupt(directory, f"{name}: unreadable ({e.strerror})") from None
    finally:
        os.close(fd)
    if got != size or extra:
        raise corrupt(directory, f"{name}: changed size while being read (is it being written?)")
    data = parts[0] if len(parts) == 1 else b"".join(parts)
    if checksum is not None and algorithm is not None:
        actual = hash_view(memoryview(data), algorithm)
        if actual != checksum:
            raise corrupt(
                directory,
                f"{name}: content changed since the save ({algorithm} is {actual}, "
                f"the manifest says {checksum})",
            )
    return data


def hash_member(directory: str | os.PathLike, name: str, size: int, algorithm: str) -> str:
    """Checksum of file `name` (regular, inside the folder, exactly `size` bytes), never reading
    past `size`."""
    directory = Path(directory)
    fd = open_member(directory, name, size)
    try:
        return _hash_fd(directory, name, fd, size, algorithm)
    finally:
        os.close(fd)


def _hash_fd(directory: Path, name: str, fd: int, size: int, algorithm: str) -> str:
    # Read with pread into a small reused buffer (never a mapping: a file truncated meanwhile
    # must raise an error, not end the process with SIGBUS).
    try:
        hasher = new_hasher(algorithm)
        buffer = bytearray(min(size, 8 << 20)) if size else bytearray()  # stays in the CPU cache
        chunk = memoryview(buffer)
        left = size
        while left:
            n = os.preadv(fd, [chunk[: min(left, len(buffer))]], size - left)
            if n == 0:
                raise corrupt(directory, f"{name}: shorter than its size while read")
            hasher.update(chunk[:n])
            left -= n
        return hasher.hexdigest()
    except OSError as e:
        raise corrupt(directory, f"{name}: unreadable ({e.strerror})") from None
