"""safetensors files written at the speed of a direct write and read from verified memory.

Writing: the header and then each tensor's bytes go straight from the tensors' memory to the file
with os.write (no Python-level copy of the data, no per-chunk callback), while a second thread
checksums the same bytes in memory, so the file's checksum costs no re-read. The layout is the
safetensors format (8-byte little-endian header length, JSON header padded to 8 bytes, tensors in
order of decreasing element size so each is aligned), readable by the `safetensors` package.

Reading: `read_tensor_file` reads a file once, each tensor straight into memory of its own, hashing
every byte in file order, and returns the tensors only after the checksum matched;
`tensors_from_buffer` parses a whole file already in memory (tensors are views of it). The header
is validated first (size bounds, dtypes, shapes, offsets inside the data, no overlap), so a hostile
header raises CheckpointCorruptError instead of reading out of bounds or asking for more memory
than the file's size.
"""

from __future__ import annotations

import json
import os
import sys
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .checksums import new_hasher
from .errors import CheckpointCorruptError
from .fs import start_writeback
from .piece_read import read_ranges_hashed
from .safe_io import check_read, ends_at, read_hashed, reading_member

if TYPE_CHECKING:
    import torch

_MAX_HEADER = 100 * 1024 * 1024
_WRITE_CHUNK = 64 << 20


def _dtype_names() -> dict[Any, str]:
    import torch

    names = {
        torch.float64: "F64",
        torch.float32: "F32",
        torch.float16: "F16",
        torch.bfloat16: "BF16",
        torch.int64: "I64",
        torch.int32: "I32",
        torch.int16: "I16",
        torch.int8: "I8",
        torch.uint8: "U8",
        torch.bool: "BOOL",
        torch.complex64: "C64",
    }
    for attr, name in (
        ("float8_e4m3fn", "F8_E4M3"),
        ("float8_e5m2", "F8_E5M2"),
        ("uint16", "U16"),
        ("uint32", "U32"),
        ("uint64", "U64"),
    ):
        if hasattr(torch, attr):
            names[getattr(torch, attr)] = name
    return names


def _byte_view(tensor: torch.Tensor) -> memoryview:
    import torch

    flat = tensor.reshape(-1)
    return memoryview(flat.view(torch.uint8).numpy()) if flat.numel() else memoryview(b"")


def supports_fast_write(tensors: Mapping[str, Any]) -> bool:
    """True when every value is a tensor of a dtype this writer knows, on a little-endian host."""
    import torch

    if sys.byteorder != "little":
        return False
    names = _dtype_names()
    return all(
        isinstance(k, str) and isinstance(v, torch.Tensor) and v.dtype in names and not v.is_sparse
        for k, v in tensors.items()
    )


def _hash_chunks(chunks: list[memoryview], algorithm: str, out: list) -> None:
    try:
        hasher = new_hasher(algorithm)
        for chunk in chunks:
            for start in range(0, len(chunk), 64 << 20):
                hasher.update(chunk[start : start + (64 << 20)])
        out.append(hasher.hexdigest())
    except BaseException as e:  # reported by the writer
        out.append(e)


def write_tensor_file(
    path: str | os.PathLike,
    tensors: Mapping[str, torch.Tensor],
    metadata: Mapping[str, str] | None,
    algorithm: str | None,
) -> tuple[int, str | None]:
    """Write `tensors` (already de-duplicated) as safetensors to `path`; return (size, checksum).

    The checksum (of `algorithm`, None for none) is computed from the bytes in memory, in parallel
    with the write. Not fsynced: the caller does it once.
    """
    names = _dtype_names()
    cpu = {}
    for name, tensor in tensors.items():
        t = tensor.detach()
        if t.device.type != "cpu":
            t = t.cpu()
        cpu[name] = t if t.is_contiguous() else t.contiguous()
    order = sorted(cpu, key=lambda n: (-cpu[n].element_size(), n))
    header: dict[str, Any] = {}
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    offset = 0
    chunks: list[memoryview] = []
    for name in order:
        t = cpu[name]
        nbytes = t.numel() * t.element_size()
        header[name] = {
            "dtype": names[t.dtype],
            "shape": list(t.shape),
            "data_offsets": [offset, offset + nbytes],
        }
        offset += nbytes
        if nbytes:
            chunks.append(_byte_view(t))
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    head = memoryview(len(text).to_bytes(8, "little") + text)
    chunks.insert(0, head)
    total = len(head) + offset
    digest: list = []
    hasher = None
    if algorithm is not None:
        hasher = threading.Thread(
            target=_hash_chunks, args=(chunks, algorithm, digest), name="cadence-ckpt-hash"
        )
        hasher.start()
    try:
        fd = os.open(
            path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_CLOEXEC", 0), 0o644
        )
        try:
            position = 0
            for chunk in chunks:
                done = 0
                while done < len(chunk):
                    n = os.write(fd, chunk[done : done + _WRITE_CHUNK])
                    # Overlap the disk's work with writing the rest: writeback starts per chunk.
                    start_writeback(fd, position, n)
                    done += n
                    position += n
        finally:
            os.close(fd)
    finally:
        if hasher is not None:
            hasher.join()
    if digest and isinstance(digest[0], BaseException):
        raise digest[0]
    return total, (digest[0] if digest else None)


def _dtypes_by_name() -> dict[str, Any]:
    return {v: k for k, v in _dtype_names().items()}


def _parse_header(
    text: bytes, size: int, source: str
) -> tuple[list[tuple[int, int, str, Any, list[int]]], dict[str, str]]:
    """Validated entries (start, end, name, dtype, shape), offsets from the file's start and sorted,
    and metadata of the JSON header `text` of a `size`-byte safetensors file."""
    import torch

    def bad(why: str) -> CheckpointCorruptError:
        return _bad(source, why)

    try:
        header = json.loads(text.decode("utf-8"))
    except RecursionError:
        raise bad("header JSON is nested too deeply") from None
    except (ValueError, UnicodeDecodeError) as e:
        raise bad(f"header is not valid JSON ({e})") from None
    if not isinstance(header, dict):
        raise bad("header is not a JSON object")
    metadata = header.pop("__metadata__", None) or {}
    if not isinstance(metadata, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()
    ):
        raise bad("__metadata__ must map strings to strings")
    data_start = 8 + len(text)
    data_size = size - data_start
    dtypes = _dtypes_by_name()
    entries = []
    for name, info in header.items():
        if not isinstance(info, dict):
            raise bad(f"entry {name[:80]!r} is not an object")
        dtype = dtypes.get(info.get("dtype")) if isinstance(info.get("dtype"), str) else None
        shape = info.get("shape")
        offsets = info.get("data_offsets")
        if dtype is None:
            raise bad(f"{name[:80]!r} has unknown dtype {str(info.get('dtype'))[:20]!r}")
        if (
            not isinstance(shape, list)
            or len(shape) > 64
            or not all(
                isinstance(d, int) and not isinstance(d, bool) and 0 <= d < 1 << 48 for d in shape
            )
        ):
            raise bad(f"{name[:80]!r} has an invalid shape")
        if (
            not isinstance(offsets, list)
            or len(offsets) != 2
            or not all(isinstance(o, int) and not isinstance(o, bool) for o in offsets)
            or not 0 <= offsets[0] <= offsets[1] <= data_size
        ):
            raise bad(f"{name[:80]!r} has data offsets outside the file")
        numel = 1
        for d in shape:
            numel *= d
        itemsize = torch.empty((), dtype=dtype).element_size()
        if numel * itemsize != offsets[1] - offsets[0]:
            raise bad(
                f"{name[:80]!r}: shape {shape} does not match its {offsets[1] - offsets[0]} bytes"
            )
        entries.append((data_start + offsets[0], data_start + offsets[1], name, dtype, shape))
    entries.sort(key=lambda e: (e[0], e[1]))
    for (_, end, a, _, _), (start, _, b, _, _) in zip(entries, entries[1:]):
        if start < end:
            raise bad(f"tensors {a[:80]!r} and {b[:80]!r} overlap")
    return entries, metadata


def _bad(source: str, why: str) -> CheckpointCorruptError:
    return CheckpointCorruptError(
        f"Cannot read safetensors file {source}: {why}", problems=[f"{source}: {why}"]
    )


def tensors_from_buffer(
    buffer: torch.Tensor, source: str
) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """Tensors (views of `buffer`, a uint8 tensor holding a whole safetensors file) and metadata."""
    import torch

    size = buffer.numel()
    if size < 8:
        raise _bad(source, f"{size} bytes, too short for a header")
    header_len = int.from_bytes(bytes(buffer[:8].numpy()), "little")
    if header_len > min(_MAX_HEADER, size - 8):
        raise _bad(source, f"header length {header_len} does not fit in the {size}-byte file")
    entries, metadata = _parse_header(bytes(buffer[8 : 8 + header_len].numpy()), size, source)
    out: dict[str, torch.Tensor] = {}
    for start, end, name, dtype, shape in entries:
        raw = buffer[start:end]
        if start % torch.empty((), dtype=dtype).element_size():
            raw = raw.clone()  # misaligned for its dtype (written by another tool): copy
        out[name] = raw.view(dtype).reshape(shape)
    return out, metadata


def read_tensor_file(
    directory: str | os.PathLike,
    name: str,
    size: int,
    checksum: str | None,
    algorithm: str | None,
) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """The tensors and metadata of safetensors file `name`, each tensor read from the file straight
    into memory of its own and every byte hashed in file order; returned only after the whole
    file had `size` bytes and (when given) `checksum`.

    One pass, no staging copy of the file: the header, which comes first, is hashed and then parsed
    (JSON, validated: every tensor inside the file, none overlapping, so the memory asked for is at
    most the file's size) to know where each tensor's bytes go; the tensors are allocated on this
    thread and filled by piece_read (two threads, hashing in file order). No tensor reaches the
    caller before the checksum of exactly the bytes in it matched. Separate tensors, like the ones
    torch.save'd weights load into, let the allocator reuse memory freed by earlier tensors.
    """
    import torch

    directory = Path(directory)
    source = os.fspath(directory / name)
    hashing = checksum is not None and algorithm is not None
    hasher = new_hasher(algorithm) if hashing else None

    def read_into(view: memoryview) -> bool:
        """Fill `view` with the next bytes of the file, hashing them; False at a short read."""
        return read_hashed(fd, view, hasher) == len(view)

    out: dict[str, torch.Tensor] = {}
    metadata: dict[str, str] = {}
    problem: CheckpointCorruptError | None = None
    complete = True
    with reading_member(directory, name, size) as fd:
        # where each byte after the header goes: a tensor, or (bytes of no tensor) None; the rest
        # of a file whose header is unusable is hashed too, so a damaged file is reported as
        # changed since the save, not by the first symptom
        position = 0
        ranges: list[tuple[int, memoryview | None]] = []
        if size < 8:
            problem = _bad(source, f"{size} bytes, too short for a header")
        else:
            head = bytearray(8)
            complete = read_into(memoryview(head))
            position = 8
            header_len = int.from_bytes(head, "little")
            if complete and header_len > min(_MAX_HEADER, size - 8):
                problem = _bad(
                    source, f"header length {header_len} does not fit in the {size}-byte file"
                )
            elif complete:
                text = bytearray(header_len)
                complete = read_into(memoryview(text))
                position += header_len
                if complete:
                    try:
                        entries, metadata = _parse_header(bytes(text), size, source)
                    except CheckpointCorruptError as e:
                        problem, entries = e, []
                    for start, end, key, dtype, shape in entries:
                        if start > position:
                            ranges.append((position, None))
                        out[key] = torch.empty(shape, dtype=dtype)
                        ranges.append((start, _byte_view(out[key])))
                        position = end
        if complete:
            if position < size:
                ranges.append((position, None))
            first = ranges[0][0] if ranges else size
            complete = read_ranges_hashed(fd, ranges, size, hasher) == size - first
        complete = complete and ends_at(fd, size)
    actual = None if hasher is None else hasher.hexdigest()
    check_read(directory, name, complete, actual, checksum, algorithm)
    if problem is not None:
        raise problem
    return out, metadata
