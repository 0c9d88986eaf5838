"""Small durable-filesystem helpers: fsync of files and folders, atomic file writes, folder swap."""

from __future__ import annotations

import ctypes
import errno
import os
import secrets
import shutil
from pathlib import Path

_RENAME_EXCHANGE = 2
_AT_FDCWD = -100


def fsync_file(path: str | os.PathLike) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_dir(path: str | os.PathLike) -> None:
    """Make a folder's entries (creations, renames) durable. A no-op where folders cannot be opened."""
    if os.name == "nt":
        return
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError as e:
        # Some filesystems refuse fsync on folders; their renames are then as durable as they get.
        if e.errno not in (errno.EINVAL, errno.EBADF, errno.ENOTSUP):
            raise
    finally:
        os.close(fd)


def write_file_atomically(path: str | os.PathLike, data: bytes, durable: bool = True) -> None:
    """Write bytes to `path` so that readers see the old content or the new one, never a mix."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.partial-{secrets.token_hex(4)}")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            if durable:
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    if durable:
        fsync_dir(path.parent)


def _libc_renameat2():
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        fn = libc.renameat2
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    fn.restype = ctypes.c_int
    return fn


_renameat2 = _libc_renameat2() if os.name == "posix" else None


def exchange_paths(a: str | os.PathLike, b: str | os.PathLike) -> bool:
    """Atomically swap two existing paths (Linux renameat2 RENAME_EXCHANGE).

    Returns False when the platform or filesystem cannot do it (the caller then falls back to two
    renames, which leave a short window that recovery handles).
    """
    if _renameat2 is None:
        return False
    result = _renameat2(
        _AT_FDCWD, os.fsencode(os.fspath(a)), _AT_FDCWD, os.fsencode(os.fspath(b)), _RENAME_EXCHANGE
    )
    if result == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.ENOTSUP, errno.EPERM, errno.EXDEV):
        return False
    raise OSError(err, f"cannot swap {a} and {b}: {os.strerror(err)}")


def remove_tree(path: str | os.PathLike) -> None:
    """Delete a folder (or file); missing is fine."""
    path = Path(path)
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=False)
    else:
        path.unlink(missing_ok=True)


def link_or_copy(src: Path, dst: Path) -> None:
    """Hard-link `src` to `dst` (a file or a whole folder), copying where links are refused."""
    if src.is_dir() and not src.is_symlink():

        def _copy(s, d):
            try:
                os.link(s, d)
            except OSError:
                shutil.copy2(s, d)

        shutil.copytree(src, dst, symlinks=True, copy_function=_copy)
    elif src.is_symlink():
        os.symlink(os.readlink(src), dst)
    else:
        try:
            os.link(src, dst)
        except OSError:
            shutil.copy2(src, dst)
