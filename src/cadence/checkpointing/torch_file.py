"""Reading a torch.save'd (zip) checkpoint file once, each large tensor record straight into memory
of its own, hashed in file order, handed over only after the whole file's checksum matched.

A whole-file buffer makes every loaded tensor a view of one large block, which the allocator must
take fresh from the kernel (a page fault per 4 KiB page: on a VM, more than reading and hashing
the bytes). Records read into separate tensors reuse memory that earlier tensors freed, as the
tensors of torch.load's own copies do, and are freed one by one later.

The records' places come from the zip directory, read before the file is hashed: those bytes are
not trusted. They only decide where each byte goes; after the checksum matched, the directory is
parsed again from the verified bytes and must give the same places, or the load fails.
"""

from __future__ import annotations

import bisect
import io
import os
import struct
import zipfile
from pathlib import Path
from typing import Any

from .checksums import new_hasher
from .piece_read import read_ranges_hashed
from .safe_io import (
    RandomAccessFile,
    check_read,
    corrupt,
    ends_at,
    reading_member,
)

_OWN_RECORD = 1 << 20  # records from this size on get memory of their own


class _PreadFile(RandomAccessFile):
    """A seekable read-only view of a descriptor through pread (its file position is untouched)."""

    def __init__(self, fd: int, size: int) -> None:
        super().__init__(size)
        self._fd = fd

    def readinto(self, b) -> int:
        view = memoryview(b).cast("B")[: max(0, self._size - self._pos)]
        n = os.preadv(self._fd, [view], self._pos) if len(view) else 0
        self._pos += n
        return n


def _record_spans(f: Any, size: int) -> list[tuple[int, int]]:
    """(start, end) of the stored data of each zip entry of at least _OWN_RECORD bytes, sorted;
    empty when the directory is unusable (then the file is read as one buffer)."""
    spans = []
    try:
        with zipfile.ZipFile(f) as archive:
            entries = archive.infolist()
        for info in entries:
            if info.file_size < _OWN_RECORD:
                continue
            if info.compress_type != zipfile.ZIP_STORED or info.compress_size != info.file_size:
                return []
            f.seek(info.header_offset)
            local = f.read(30)
            if len(local) != 30 or local[:4] != b"PK\x03\x04":
                return []
            name_len, extra_len = struct.unpack("<HH", local[26:30])
            start = info.header_offset + 30 + name_len + extra_len
            spans.append((start, start + info.file_size))
    except (zipfile.BadZipFile, ValueError, OSError, EOFError, RecursionError, struct.error):
        return []
    spans.sort()
    if any(a[1] > b[0] for a, b in zip(spans, spans[1:])) or (spans and spans[-1][1] > size):
        return []
    return spans


class SegmentedFile:
    """A verified file held as consecutive byte segments (uint8 tensors): `open()` reads it as a
    file, `storage()` cuts records out of it the way torch cuts them out of a whole-file storage."""

    def __init__(self, segments: list[tuple[int, Any]], size: int) -> None:
        self.segments = segments
        self.size = size
        self._starts = [start for start, _ in segments]

    def _locate(self, position: int) -> int:
        return bisect.bisect_right(self._starts, position) - 1

    def open(self) -> io.RawIOBase:
        """A seekable read-only file over the segments (no copy of them)."""
        return _SegmentReader(self)

    def storage(self) -> Any:
        """An object whose [start:stop] is the UntypedStorage of those bytes (one segment's)."""
        return _SegmentStorage(self)


class _SegmentReader(RandomAccessFile):
    def __init__(self, file: SegmentedFile) -> None:
        super().__init__(file.size)
        self._file = file

    def readinto(self, b) -> int:
        out = memoryview(b).cast("B")
        done = 0
        while done < len(out) and self._pos < self._file.size:
            index = self._file._locate(self._pos)
            start, segment = self._file.segments[index]
            view = memoryview(segment.numpy())[self._pos - start :][: len(out) - done]
            out[done : done + len(view)] = view
            done += len(view)
            self._pos += len(view)
        return done


class _SegmentStorage:
    def __init__(self, file: SegmentedFile) -> None:
        self._file = file

    def __getitem__(self, key: slice) -> Any:
        start, stop = key.start, key.stop
        index = self._file._locate(start)
        first, segment = self._file.segments[max(index, 0)]
        if index < 0 or stop - first > segment.numel():
            raise ValueError(f"bytes {start}-{stop} span segments of the file")
        storage = segment.untyped_storage()
        if start == first and stop - first == segment.numel() and segment.storage_offset() == 0:
            return storage
        offset = segment.storage_offset() + start - first
        return storage[offset : offset + stop - start]


def read_torch_file(
    directory: str | os.PathLike, name: str, size: int, checksum: str | None, algorithm: str | None
) -> SegmentedFile:
    """Read torch file `name` once (large records into tensors of their own, the rest into small
    buffers, all allocated on this thread and filled by piece_read), hashing every byte in file
    order; raise CheckpointCorruptError unless it has `size` bytes and (when given) `checksum`,
    and unless its verified zip directory places the records where they were read to."""
    import torch

    directory = Path(directory)
    hasher = new_hasher(algorithm) if checksum is not None and algorithm is not None else None
    with reading_member(directory, name, size) as fd:
        spans = _record_spans(_PreadFile(fd, size), size)
        bounds = []  # consecutive (start, end) of the segments, the large records among them
        position = 0
        for start, end in spans:
            if start > position:
                bounds.append((position, start))
            bounds.append((start, end))
            position = end
        if position < size or not bounds:
            bounds.append((position, size))
        segments = [(start, torch.empty(end - start, dtype=torch.uint8)) for start, end in bounds]
        ranges = [
            (start, memoryview(segment.numpy()) if segment.numel() else memoryview(b""))
            for start, segment in segments
        ]
        complete = read_ranges_hashed(fd, ranges, size, hasher) == size and ends_at(fd, size)
    actual = None if hasher is None else hasher.hexdigest()
    check_read(directory, name, complete, actual, checksum, algorithm)
    file = SegmentedFile(segments, size)
    if spans and _record_spans(file.open(), size) != spans:
        raise corrupt(directory, f"{name}: its zip directory changed while it was read")
    return file
