"""Reading a file into memory that is already allocated, hashing every byte in file order.

The destination is a list of consecutive ranges of the file, each with the memory its bytes go to
(a tensor's bytes, a record's own buffer) or None (bytes that belong to nothing kept: read into a
small scratch buffer of the reading thread, hashed, and dropped). The ranges are cut into pieces
of `PIECE` bytes; two threads read alternate pieces (pread: no shared file position), and the
thread that read a piece hashes it right away, from its own core's cache, as soon as the piece
before it is hashed. So the copy out of the page cache and the first touch of fresh memory use
both cores, while the checksum still goes through the bytes exactly in file order.

For a file that is not in the page cache (a restart on another node), the threads ask the kernel
to read `READ_AHEAD` bytes ahead (posix_fadvise WILLNEED), so the disk works while the bytes
already there are copied and hashed.

The memory is allocated by the caller, on its own thread: memory freed earlier on that thread is
reused, where a worker thread's allocations would fault in fresh pages.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from typing import Any

PIECE = 2 << 20  # hashed right after its read, while it is still in the reading core's cache
READ_AHEAD = 64 << 20  # what the kernel is asked to read ahead of the pieces being copied
# Below this many bytes one thread reads and hashes: a second thread costs more than it saves.
PARALLEL_FROM = 16 << 20
THREADS = max(1, min(2, os.cpu_count() or 1))

Range = tuple[int, "memoryview | None"]  # (offset in the file, where its bytes go, or None)


def _pread_exactly(fd: int, view: memoryview, offset: int) -> int:
    """Read at `offset` until `view` is full or the file ends; the bytes read."""
    got = 0
    while got < len(view):
        n = os.preadv(fd, [view[got:]], offset + got)
        if n == 0:
            break
        got += n
    return got


def _advise(fd: int, offset: int, length: int) -> None:
    """Ask the kernel to start reading [offset, offset + length) into the page cache (a hint)."""
    if length > 0 and hasattr(os, "posix_fadvise"):
        try:
            os.posix_fadvise(fd, offset, length, os.POSIX_FADV_WILLNEED)
        except OSError:
            pass  # a hint only: the reads below do the work either way


def _pieces(ranges: Sequence[Range], end: int) -> list[tuple[int, int, Any, int]]:
    """(offset, length, memory or None, where to read ahead from or -1) of pieces of at most PIECE
    bytes, in file order; a range ends where the next begins, the last one at `end`. The first
    piece of each READ_AHEAD window asks for the window after it."""
    out = []
    first = ranges[0][0]
    window = -1
    for index, (offset, view) in enumerate(ranges):
        stop = ranges[index + 1][0] if index + 1 < len(ranges) else end
        if view is not None and len(view) != stop - offset:
            raise ValueError(f"range at {offset}: {len(view)} bytes of memory for {stop - offset}")
        for start in range(offset, stop, PIECE):
            length = min(PIECE, stop - start)
            memory = None if view is None else view[start - offset : start - offset + length]
            ahead = -1
            if (start - first) // READ_AHEAD != window:
                window = (start - first) // READ_AHEAD
                ahead = first + (window + 1) * READ_AHEAD
            out.append((start, length, memory, ahead if 0 <= ahead < end else -1))
    return out


def read_ranges_hashed(fd: int, ranges: Sequence[Range], end: int, hasher: Any) -> int:
    """Fill `ranges` (consecutive, from ranges[0]'s offset to `end`) from `fd`, hashing every byte
    in file order with `hasher` (or none); the bytes read, fewer than the ranges' total when the
    file ended early (then nothing after the first short piece was hashed)."""
    if not ranges:
        return 0
    pieces = _pieces(ranges, end)
    total = end - ranges[0][0]
    threads = THREADS if total >= PARALLEL_FROM else 1
    _advise(fd, ranges[0][0], min(total, READ_AHEAD))
    if threads == 1:
        return _read_alone(fd, pieces, end, hasher)
    return _read_together(fd, pieces, end, hasher, threads)


def _read_piece(fd: int, piece: tuple, end: int, scratch: list) -> tuple[memoryview, int]:
    """Read one piece `(offset, length, view, ahead)` into its view (a piece whose bytes are not
    kept reads into the thread's one scratch buffer, made on first use and held in `scratch`),
    first asking the kernel to read ahead from `ahead` where that is set. Returns the view and
    how many bytes were read (fewer than `length` where the file ends early)."""
    offset, length, view, ahead = piece
    if view is None:
        if not scratch:
            scratch.append(memoryview(bytearray(PIECE)))
        view = scratch[0][:length]
    if ahead >= 0:
        _advise(fd, ahead, min(READ_AHEAD, end - ahead))
    return view, _pread_exactly(fd, view, offset)


def _read_alone(fd: int, pieces: list, end: int, hasher: Any) -> int:
    scratch: list = []
    got_total = 0
    for piece in pieces:
        length = piece[1]
        view, got = _read_piece(fd, piece, end, scratch)
        if hasher is not None:
            hasher.update(view[:got])
        got_total += got
        if got < length:
            break
    return got_total


def _read_together(fd: int, pieces: list, end: int, hasher: Any, threads: int) -> int:
    """`threads` threads (this one among them) read pieces in turn (thread k the pieces k,
    k + threads, ...); each hashes its piece once the one before it is hashed: the turn to hash
    goes round the threads, one semaphore each."""
    count = len(pieces)
    turns = [threading.Semaphore(0) for _ in range(threads)]
    turns[0].release()
    stop = threading.Event()
    failure: list[BaseException] = []
    hashed = [0]

    def halt() -> None:
        stop.set()
        for turn in turns:  # nobody waits for a turn that will never come
            turn.release()

    def work(k: int) -> None:
        scratch: list = []
        try:
            for i in range(k, count, threads):
                if stop.is_set():
                    return
                length = pieces[i][1]
                view, got = _read_piece(fd, pieces[i], end, scratch)
                turns[k].acquire()
                if stop.is_set():
                    return
                if hasher is not None:
                    hasher.update(view[:got])
                hashed[0] += got
                if got < length:  # the file ended early: the caller reports its size
                    halt()
                    return
                turns[(k + 1) % threads].release()
        except BaseException as e:  # re-raised by the calling thread below
            failure.append(e)
            halt()

    helpers = [
        threading.Thread(target=work, args=(k,), name="cadence-ckpt-read", daemon=True)
        for k in range(1, threads)
    ]
    for thread in helpers:
        thread.start()
    try:
        work(0)
    finally:
        for thread in helpers:
            thread.join()
    if failure:
        raise failure[0]
    return hashed[0]
