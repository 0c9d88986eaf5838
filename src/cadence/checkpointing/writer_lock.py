"""One writer per project directory: a lock that a second live job saving into the same
`project_dir` (automatic checkpoint naming) finds taken, so it is refused before it touches anything.

The lock is an flock(2) on the project folder itself, held for as long as the process lives: the
kernel releases it when the holder dies, however it dies, so a lock left by a dead job is simply
taken over. Who holds it (host, pid, start time, the launcher's job id and the command line, which
is what the refusal names) is kept in an extended attribute of the folder (`user.cadence.writer`).
Neither adds an entry to the folder: `os.listdir(project_dir)` shows what Accelerate's would, and
Accelerate's own resume, which reads every name in `checkpoints/` as a numbered checkpoint, still
works on the folder.

Where the filesystem cannot flock a directory (NFS emulates flock with byte-range locks, which need
a file open for writing) or keep extended attributes, the lock and its record fall back to a file
next to the checkpoints' other state, `checkpoints/.cadence-writer.lock`.

    lock = acquire_writer_lock(project_dir)   # WriterLockedError when another live job holds it

A worker of a newer restart generation of the same job (same torch elastic run id, or the same
launch token) is not refused when the holder is a worker of an older generation still alive (frozen,
say): the restarted job writes, and fencing keeps the older worker from committing.

CADENCE_PROJECT_DIR_LOCK=0 in the environment (of every process) turns the check off.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import socket
import sys
import threading
import time
from pathlib import Path
from typing import Any

from ..core.settings import env_bool, env_text
from ..diagnostics.generation_env import current_generation
from .errors import CheckpointError
from .rotation import CHECKPOINTS_DIRNAME

LOCK_NAME = ".cadence-writer.lock"  # the fallback file, in checkpoints/
RECORD_XATTR = "user.cadence.writer"  # the holder's record, on the project folder

# Job identifiers set by common launchers and schedulers, in order of preference.
_JOB_VARIABLES = (
    "SLURM_JOB_ID",
    "PBS_JOBID",
    "LSB_JOBID",
    "JOB_ID",
    "TORCHELASTIC_RUN_ID",
    "KUBERNETES_POD_NAME",
)

# real project folder -> (pid, fd, locked path) held by this process
_held: dict[str, tuple[int, int, Path]] = {}
_held_lock = threading.Lock()


class WriterLockedError(CheckpointError):
    """Another live job is saving checkpoints into the same project directory."""


def _job_identity() -> str | None:
    """Who this job is across its restarts: torch elastic's run id, else a digest of the launch's
    job token (never the token itself: the lock file is readable by others)."""
    run_id = env_text("TORCHELASTIC_RUN_ID")
    if run_id and run_id != "none":
        return f"run:{run_id}"
    token = env_text("CADENCE_JOB_TOKEN")
    if token:
        return "token:" + hashlib.sha256(token.encode()).hexdigest()[:16]
    return None


def _superseded_holder(holder: Any) -> bool:
    """Whether the live holder is a worker of an older restart generation of this same job (frozen,
    say, while the job restarted): then this newer generation writes, and fencing
    (checkpointing/generation.py) keeps the older one from committing anything."""
    ours = current_generation()
    if not isinstance(holder, dict) or ours is None or _job_identity() is None:
        return False
    theirs = holder.get("generation")
    return (
        holder.get("job_identity") == _job_identity() and isinstance(theirs, int) and theirs < ours
    )


def _holder_info() -> dict[str, Any]:
    job = {name: env_text(name) for name in _JOB_VARIABLES if env_text(name)}
    return {
        "job_identity": _job_identity(),
        "generation": current_generation(),
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "job": job,
        "command": " ".join(sys.argv)[:500],
    }


def describe_holder(info: Any) -> str:
    """A one-line description of the job recorded in a lock file."""
    if not isinstance(info, dict):
        return "an unknown job (its lock file is unreadable)"
    job = info.get("job") or {}
    parts = [f"pid {info.get('pid')} on host {info.get('host')}"]
    if job:
        parts.append(", ".join(f"{k}={v}" for k, v in job.items()))
    if info.get("started"):
        parts.append(f"started {info['started']}")
    if info.get("command"):
        parts.append(f"command: {info['command']}")
    return "; ".join(parts)


def fallback_lock_path(project_dir: str | os.PathLike) -> Path:
    """The lock file used where the project folder itself cannot be locked or labelled."""
    return Path(project_dir) / CHECKPOINTS_DIRNAME / LOCK_NAME


def read_holder(project_dir: str | os.PathLike) -> Any:
    """What the lock of `project_dir` records about its holder (None when nothing readable is)."""
    try:
        return json.loads(os.getxattr(os.fspath(project_dir), RECORD_XATTR))
    except (OSError, ValueError, AttributeError):
        pass
    try:
        return json.loads(fallback_lock_path(project_dir).read_text())
    except (OSError, ValueError):
        return None


# errno values that say "this filesystem cannot do that here" rather than "someone holds it".
_UNSUPPORTED = {errno.EBADF, errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOTSUP, errno.EINVAL}


def _lock_folder(project_dir: Path, record: bytes) -> int | None:
    """flock the folder itself and label it; the descriptor, or None when this filesystem cannot
    (the caller falls back to the lock file). Raises BlockingIOError when a live process holds it."""
    import fcntl  # POSIX only, like the rest of checkpoint saving

    fd = os.open(project_dir, os.O_RDONLY | os.O_DIRECTORY | getattr(os, "O_CLOEXEC", 0))
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise
    except OSError as e:
        os.close(fd)
        if e.errno in _UNSUPPORTED:
            return None
        raise
    try:
        os.setxattr(fd, RECORD_XATTR, record)
    except (OSError, AttributeError) as e:
        os.close(fd)  # releases the flock: the fallback file then carries lock and record together
        if isinstance(e, AttributeError) or e.errno in _UNSUPPORTED | {errno.EPERM, errno.E2BIG}:
            return None
        raise
    return fd


def _lock_file(path: Path, record: bytes) -> int:
    """flock the fallback lock file and write the record into it; the descriptor. Raises
    BlockingIOError when a live process holds it."""
    import fcntl  # POSIX only, like the rest of checkpoint saving

    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        raise
    os.ftruncate(fd, 0)
    os.pwrite(fd, record, 0)
    return fd


def acquire_writer_lock(project_dir: str | os.PathLike) -> Path:
    """Take (or keep, when this process holds it already) the writer lock of `project_dir`.

    Raises WriterLockedError naming the other job when a live process holds it; writes nothing
    then. A lock whose holder died is taken over. Returns the locked path (the folder itself, or
    the fallback lock file).
    """
    project_dir = Path(project_dir)
    project_dir.mkdir(parents=True, exist_ok=True)
    key = os.path.realpath(project_dir)
    record = (json.dumps(_holder_info(), indent=1) + "\n").encode()
    with _held_lock:
        held = _held.get(key)
        if held is not None and held[0] == os.getpid():
            return held[2]
        path = project_dir
        try:
            fd = _lock_folder(project_dir, record)
            if fd is None:
                # Every process on this filesystem falls back alike, so they meet on the file.
                path = fallback_lock_path(project_dir)
                fd = _lock_file(path, record)
        except BlockingIOError:
            holder = read_holder(project_dir)
            if _superseded_holder(holder):
                return path  # this job's older generation holds it; fencing keeps it from writing
            raise WriterLockedError(
                f"Another job is saving checkpoints into {project_dir} right now: "
                f"{describe_holder(holder)}. Two jobs writing automatically named checkpoints "
                "into one project_dir overwrite each other's checkpoints; give this job its own "
                "project_dir, or stop the other job first (its lock on the folder is released "
                "when it ends).",
                path=project_dir,
            ) from None
        except OSError as e:
            raise CheckpointError(
                f"Cannot lock {path} ({e.strerror}): the filesystem of {project_dir} does not "
                "support file locks (flock), so Cadence cannot make sure no other job saves "
                "there too. Set CADENCE_PROJECT_DIR_LOCK=0 to save without that check.",
                path=project_dir,
            ) from None
        _held[key] = (os.getpid(), fd, path)
    return path


def release_writer_lock(project_dir: str | os.PathLike) -> None:
    """Give up this process's writer lock of `project_dir` (no-op when it holds none)."""
    key = os.path.realpath(Path(project_dir))
    with _held_lock:
        held = _held.pop(key, None)
        if held is not None and held[0] == os.getpid():
            os.close(held[1])  # closing the only descriptor releases the flock


def claim_project_dir(
    project_dir: str | os.PathLike, *, is_main: bool, rank: int, agree: Any
) -> None:
    """Before a job's first automatically named save: the main process takes the writer lock of
    `project_dir`, and every rank learns the outcome through `agree` (a collective that returns
    every rank's list item, such as gather_object), so a refusal is raised on every rank, naming it,
    before any of them touches the folder."""
    if not env_bool("CADENCE_PROJECT_DIR_LOCK", default=True):
        return  # switched off: the reference's behaviour (see docs/differences.md)
    message = None
    if is_main:
        try:
            acquire_writer_lock(project_dir)
        except CheckpointError as e:
            message = str(e)
    outcomes = agree([message])
    refused = next((m for m in outcomes if m), None)
    if refused is not None:
        raise WriterLockedError(f"save_state refused on rank {rank}: {refused}", path=project_dir)
