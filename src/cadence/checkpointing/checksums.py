"""Checksum algorithms of checkpoint files, by the name a manifest records.

New checkpoints use xxh3_128 (a fast non-cryptographic 128-bit hash) from `xxhash`, a core
dependency. Measured on one core of the development machine (256 MB in memory): xxh3_128
11 GB/s, zlib.crc32 3.3 GB/s, sha256 1.4 GB/s, blake2b 0.7 GB/s; hashing in C releases the GIL,
so files are hashed while other threads read. sha256 stays the fallback where xxhash cannot be
imported, and crc32 and sha256 stay readable: the manifest records each checkpoint's algorithm.

Checksums of pieces (since issue 46): `xxh3_128-pieces-64MiB` (the default for new checkpoints)
cuts a file into pieces of 64 MiB (the last one shorter; none for an empty file), hashes each with
xxh3_128 and records the xxh3_128 of the pieces' digests, one after the other. Each byte is still
hashed once, in the same pass as before (the hasher cuts the bytes it is given at the pieces'
boundaries), and a file is still checked in one pass where one process reads it; where the ranks
of a machine share the work, each hashes some of the pieces and all combine the digests
(node_verify). Piece sizes are powers of two from 1 MiB to 1 GiB, each its own name; sha256 and
crc32 have the same forms. A Cadence older than this refuses such a checkpoint as using an
unknown algorithm ("upgrade Cadence"); checkpoints with whole-file checksums load as before.
"""

from __future__ import annotations

import hashlib
import zlib
from functools import partial
from typing import Any


class _Crc32:
    """hashlib-like wrapper so crc32 can be chosen like any other algorithm."""

    def __init__(self) -> None:
        self._value = 0

    def update(self, data) -> None:
        self._value = zlib.crc32(data, self._value)

    def hexdigest(self) -> str:
        return f"{self._value:08x}"

    def digest(self) -> bytes:
        return self._value.to_bytes(4, "big")


def _xxh3_128():
    import xxhash  # imported lazily: `import cadence` stays cheap

    return xxhash.xxh3_128()


WHOLE_FILE = {"sha256": hashlib.sha256, "crc32": _Crc32, "xxh3_128": _xxh3_128}
PIECE_SIZES = tuple(1 << shift for shift in range(20, 31))  # 1 MiB ... 1 GiB
DEFAULT_PIECE = 64 << 20  # the piece size of new checkpoints' checksums
_PIECES_MARK = "-pieces-"


class PieceHasher:
    """hashlib-like (update / hexdigest): the checksum of a file cut into pieces of `piece` bytes
    (the digest, with `base`, of the pieces' digests one after the other), fed in any chunks."""

    def __init__(self, base: str, piece: int) -> None:
        self._new = WHOLE_FILE[base]
        self.piece = piece
        self.digests: list[bytes] = []
        self._current = self._new()
        self._filled = 0

    def update(self, data) -> None:
        view = memoryview(data)
        if view.format != "B" or view.ndim != 1:
            view = view.cast("B")
        while len(view):
            take = min(len(view), self.piece - self._filled)
            self._current.update(view[:take])
            self._filled += take
            view = view[take:]
            if self._filled == self.piece:
                self.digests.append(self._current.digest())
                self._current = self._new()
                self._filled = 0

    def hexdigest(self) -> str:
        tail = [self._current.digest()] if self._filled else []
        return combine_pieces(self._new, [*self.digests, *tail])


def combine_pieces(new: Any, digests: list[bytes]) -> str:
    """The checksum of a file from its pieces' digests, in file order (`new`: the base hasher)."""
    root = new()
    for digest in digests:
        root.update(digest)
    return root.hexdigest()


def pieces_name(base: str, piece: int) -> str:
    """The name a manifest records for checksums of `base` over pieces of `piece` bytes."""
    return f"{base}{_PIECES_MARK}{piece >> 20}MiB"


def split_name(algorithm: str) -> tuple[str, int | None]:
    """(base algorithm, piece size or None for a whole-file checksum) of a known `algorithm`."""
    base, mark, size = algorithm.partition(_PIECES_MARK)
    if not mark:
        return algorithm, None
    return base, int(size[: -len("MiB")]) << 20


ALGORITHMS: dict[str, Any] = dict(WHOLE_FILE)
for _base in WHOLE_FILE:
    for _size in PIECE_SIZES:
        ALGORITHMS[pieces_name(_base, _size)] = partial(PieceHasher, _base, _size)


def xxhash_installed() -> bool:
    """True when the `xxhash` package can be imported (a core dependency; absent only in an
    install that skipped dependencies)."""
    try:
        import xxhash  # noqa: F401  # imported lazily
    except ImportError:
        return False
    return True


def default_checksum(installed: bool | None = None) -> str:
    """xxh3_128 (from `xxhash`, a core dependency), else sha256, over pieces of DEFAULT_PIECE
    bytes (`installed`: whether xxhash is, when the caller knows)."""
    installed = xxhash_installed() if installed is None else installed
    return pieces_name("xxh3_128" if installed else "sha256", DEFAULT_PIECE)


def checksum_available(algorithm: str, installed: bool | None = None) -> bool:
    """True when `algorithm` is known and its package is installed (`installed`: whether xxhash
    is, when the caller knows)."""
    if algorithm not in ALGORITHMS:
        return False
    if split_name(algorithm)[0] != "xxh3_128":
        return True
    return xxhash_installed() if installed is None else installed


def new_hasher(algorithm: str):
    """A fresh hasher (update / hexdigest) for `algorithm`; ValueError when unknown or unavailable."""
    if algorithm not in ALGORITHMS:
        raise ValueError(
            f"Unknown checksum algorithm {algorithm!r}; supported: {sorted(WHOLE_FILE)}, "
            f"and each over pieces ({pieces_name('xxh3_128', DEFAULT_PIECE)!r}: pieces of "
            "1 MiB to 1 GiB, powers of two)."
        )
    if not checksum_available(algorithm):
        raise ValueError(
            f"Checksum algorithm {algorithm!r} needs the `xxhash` package: pip install xxhash."
        )
    return ALGORITHMS[algorithm]()
