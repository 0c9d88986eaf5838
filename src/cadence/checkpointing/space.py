"""Disk space: check before writing, and name a full disk when a write fails.

A checkpoint that does not fit must fail with an error that says so (OSError with errno ENOSPC:
"no space left on <path>: needed about X MB, Y MB free"), not with a serializer's internal message.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Mapping
from typing import Any

_SPACE_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG}
_PER_FILE_OVERHEAD = 64 * 1024


def free_bytes(path: str | os.PathLike) -> int | None:
    """Bytes available to this user on the filesystem of `path` (None where unknown)."""
    try:
        info = os.statvfs(path)
    except (OSError, AttributeError):
        return None
    return info.f_bavail * info.f_frsize


def _payload_bytes(obj: Any, seen: set[int]) -> int:
    import torch

    if isinstance(obj, torch.Tensor):
        if id(obj) in seen or obj.device.type == "meta":
            return 0
        seen.add(id(obj))
        return obj.numel() * obj.element_size()
    if isinstance(obj, Mapping):
        return sum(_payload_bytes(v, seen) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(_payload_bytes(v, seen) for v in obj)
    if isinstance(obj, (bytes, bytearray)):
        return len(obj)
    return 0


def estimate_bytes(files: Mapping[str, Any]) -> int:
    """About how many bytes writing `{name: payload}` takes (tensor data plus a margin per file)."""
    seen: set[int] = set()
    return sum(_payload_bytes(p, seen) + _PER_FILE_OVERHEAD for p in files.values())


def _mb(n: int) -> str:
    return f"{n / 1e6:.1f}"


def no_space_error(folder: str | os.PathLike, needed: int, cause: BaseException | None = None):
    """OSError(ENOSPC) naming the folder, the bytes needed and the bytes free."""
    free = free_bytes(folder)
    code = (
        errno.EFBIG if isinstance(cause, OSError) and cause.errno == errno.EFBIG else errno.ENOSPC
    )
    where = os.fspath(folder)
    if code == errno.EFBIG:
        message = (
            f"no space left on {where}: a file exceeds the size limit of this process "
            f"(RLIMIT_FSIZE) or filesystem; needed about {_mb(needed)} MB"
        )
    else:
        message = (
            f"no space left on {where}: needed about {_mb(needed)} MB, "
            f"{'?' if free is None else _mb(free)} MB free"
        )
    return OSError(
        code, message + ". Free some space or save elsewhere; the previous checkpoint is intact."
    )


def ensure_space(folder: str | os.PathLike, needed: int) -> None:
    """Raise OSError(ENOSPC) before writing when `needed` bytes clearly do not fit."""
    free = free_bytes(folder)
    if free is not None and needed > free:
        raise no_space_error(folder, needed)


def as_space_error(
    error: BaseException, folder: str | os.PathLike, needed: int
) -> BaseException | None:
    """The ENOSPC error to raise instead of `error` when `error` came from a full disk, else None.

    torch.save reports a full disk as a RuntimeError about stream positions; it counts as one when
    the filesystem is (nearly) full.
    """
    if isinstance(error, OSError) and error.errno in _SPACE_ERRNOS:
        return no_space_error(folder, needed, error)
    if isinstance(error, RuntimeError):
        text = str(error)
        free = free_bytes(folder)
        if ("unexpected pos" in text or "write" in text.lower()) and (
            free is None or free < max(needed // 10, 1 << 20)
        ):
            return no_space_error(folder, needed, error)
    return None
