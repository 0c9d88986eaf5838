"""Small durable-filesystem helpers: fsync of files and folders, atomic file writes, folder swap."""

from __future__ import annotations

import ctypes
import errno
import logging
import os
import secrets
import shutil
import threading
from pathlib import Path

logger = logging.getLogger(__name__)

_RENAME_EXCHANGE = 2
_AT_FDCWD = -100


def _libc_sync_file_range():
    try:
        fn = ctypes.CDLL(None, use_errno=True).sync_file_range
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
    fn.restype = ctypes.c_int
    return fn


_sync_file_range = _libc_sync_file_range() if os.name == "posix" else None
_SYNC_FILE_RANGE_WRITE = 2


def start_writeback(fd: int, offset: int, nbytes: int) -> None:
    """Ask the kernel to start writing a just-written range to disk now, without waiting (Linux
    sync_file_range), so the fsync that makes the file durable later has little left to do."""
    if _sync_file_range is not None and nbytes > 0:
        _sync_file_range(fd, offset, nbytes, _SYNC_FILE_RANGE_WRITE)


def fsync_file(path: str | os.PathLike) -> None:
    """Flush the file at `path` to disk with `os.fsync`."""
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


def write_file_durably(path: str | os.PathLike, data: bytes, durable: bool = True) -> None:
    """Write bytes to a new file in a folder nobody reads yet, fsync the file (not the folder)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_CLOEXEC", 0), 0o644)
    try:
        view = memoryview(data)
        done = 0
        while done < len(view):
            done += os.write(fd, view[done:])
        if durable:
            os.fsync(fd)
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


def remove_tree(path: str | os.PathLike, missing_ok: bool = True) -> None:
    """Delete a folder (or file); missing is fine, and so are entries that vanish meanwhile (another
    process removing the same folder)."""
    path = Path(path)
    if path.is_dir() and not path.is_symlink():

        def vanished(_function, _name, excinfo) -> None:
            error = excinfo[1] if isinstance(excinfo, tuple) else excinfo
            if not (missing_ok and isinstance(error, FileNotFoundError)):
                raise error

        shutil.rmtree(path, onerror=vanished)
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


# Removals running in the background (old checkpoint folders after a commit or a rotation).
_removals_lock = threading.Lock()
_removals: list[threading.Thread] = []


def _remove_quietly(path: Path) -> None:
    try:
        remove_tree(path)
    except OSError as e:  # a hidden leftover; the next save's cleanup retries it
        logger.warning("Could not delete %s: %s", path, e)


_SMALL_FOLDER_BYTES = 64 * 1024 * 1024


def _tree_bytes(path: Path, limit: int) -> int:
    total = 0
    for root, _dirs, names in os.walk(path):
        for name in names:
            try:
                total += os.lstat(os.path.join(root, name)).st_size
            except OSError:
                continue
            if total > limit:
                return total
    return total


def remove_later(path: str | os.PathLike) -> None:
    """Delete a folder (already renamed to a hidden name) in a background thread.

    Freeing the blocks of a large, freshly written folder takes a noticeable time; nothing waits
    for it except `wait_for_removals()` (the next save, load or the end of training). The thread is
    not a daemon, so a normally exiting interpreter finishes the removal. Small folders (under
    64 MB) are removed at once: that costs less than starting a thread.
    """
    path = Path(path)
    if _tree_bytes(path, _SMALL_FOLDER_BYTES) <= _SMALL_FOLDER_BYTES:
        _remove_quietly(path)
        return
    thread = threading.Thread(
        target=_remove_quietly, args=(Path(path),), name="cadence-ckpt-remove", daemon=False
    )
    with _removals_lock:
        _removals[:] = [t for t in _removals if t.is_alive()]
        _removals.append(thread)
    thread.start()


def wait_for_removals() -> None:
    """Block until every background removal started by remove_later() has finished."""
    with _removals_lock:
        pending = list(_removals)
        _removals.clear()
    for thread in pending:
        thread.join()
