"""Atomic commit of a checkpoint folder.

A checkpoint is written into a hidden sibling `.NAME.tmp-TOKEN` of its final folder `NAME`. Each
process writes its own files there, fsyncs them and drops a small marker listing them (with sizes and
checksums, so hashing is spread over the processes). The committing process then waits for every
expected marker, writes `cadence_manifest.json` last, fsyncs and renames the folder into place. A
process killed at any point leaves either the previous state or the complete new checkpoint under
`NAME`, never a mix; leftovers are hidden folders that `cleanup_stale_siblings` removes.

No torch.distributed call happens here: the caller broadcasts the token and places barriers.

    writer = begin_checkpoint(final_dir, token=token_from_main, rank=rank)
    writer.save_tensors("model.safetensors", state_dict)     # every rank: its own files
    writer.rank_done()
    <barrier>
    if rank == 0:
        writer.commit(world_size=world_size)
"""

from __future__ import annotations

import json
import logging
import os
import re
import secrets
import threading
from collections.abc import Iterable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path, PurePosixPath
from typing import Any

from .errors import CheckpointCommitError, CheckpointError, describe_problems
from .fs import (
    exchange_paths,
    fsync_dir,
    fsync_file,
    link_or_copy,
    remove_later,
    remove_tree,
    write_file_durably,
)
from .generation import fence
from .manifest import (
    MANIFEST_NAME,
    FileRecord,
    Manifest,
    default_checksum,
    describe_file,
    is_complete,
    is_manifest_name,
    new_hasher,
    rank_manifests,
    read_manifest,
)
from .rank_markers import (
    MARKER_RE,
    failure_marker_name,
    gather_rank_records,
    marker_name,
    write_marker,
)
from .safe_io import hash_view
from .serialization import (
    SAFETENSORS_METADATA,
    dedupe_shared_tensors,
    write_safetensors,
    write_torch_hashed,
)
from .tensor_file import supports_fast_write, write_tensor_file

logger = logging.getLogger(__name__)

_TOKEN_RE = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
_SIBLING_RE = re.compile(
    r"^\.(?P<name>.+)\.(?P<kind>tmp|old|deleting)-(?P<token>[A-Za-z0-9_-]{1,64})$"
)

# Temporary folders of saves in flight in this process; cleanup never touches them.
_active_lock = threading.Lock()
_active_tmp_dirs: set[str] = set()


def new_token() -> str:
    """A random token naming one save's temporary folder; broadcast it so all ranks agree."""
    return secrets.token_hex(8)


def temporary_dir_for(final_dir: str | os.PathLike, token: str) -> Path:
    """The hidden temporary directory a checkpoint is written to before it is renamed."""
    final_dir = Path(final_dir)
    return final_dir.parent / f".{final_dir.name}.tmp-{token}"


def _check_token(token: str) -> str:
    if not isinstance(token, str) or not _TOKEN_RE.match(token):
        raise ValueError(
            f"Checkpoint token must be 1-64 letters, digits, '-' or '_', got {token!r}. "
            "Use cadence.checkpointing.new_token() on the main process and broadcast it."
        )
    return token


def _resolve_final(final_dir: str | os.PathLike) -> Path:
    final = Path(os.path.expanduser(os.fspath(final_dir)))
    if final.is_symlink() and final.is_dir():
        final = final.resolve()  # replace the folder the link points to, keep the link
    final = final.parent.resolve() / final.name
    if final.exists() and not final.is_dir():
        raise NotADirectoryError(
            f"Cannot save a checkpoint to {final}: it exists and is a file, not a folder. "
            "Pass a folder path (it will be created)."
        )
    if final.name in ("", ".", ".."):
        raise ValueError(f"Cannot save a checkpoint to {final_dir!r}: give a folder name.")
    return final


def _check_name(name: str) -> str:
    """A file name relative to the checkpoint folder, with '/' separators."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"Checkpoint file name must be a non-empty string, got {name!r}")
    pure = PurePosixPath(name.replace(os.sep, "/"))
    if pure.is_absolute() or ".." in pure.parts or str(pure) in (".", ""):
        raise ValueError(
            f"Checkpoint file name must be relative and stay inside the folder, got {name!r}"
        )
    text = str(pure)
    if is_manifest_name(text) or MARKER_RE.match(pure.name):
        raise ValueError(f"{name!r} is reserved by Cadence's checkpoint format; pick another name.")
    return text


class CheckpointWriter:
    """Writes one process's files of one checkpoint into the shared temporary folder."""

    def __init__(
        self,
        final_dir: Path,
        token: str,
        rank: int,
        committer: bool,
        durable: bool,
        checksum: str,
    ) -> None:
        self.final_dir = final_dir
        self.token = token
        self.tmp_dir = temporary_dir_for(final_dir, token)
        self.rank = rank
        self.committer = committer
        self.durable = durable
        self.checksum = checksum
        self._pending: dict[str, Future] = {}
        self._records: dict[str, FileRecord] = {}
        self._pool: ThreadPoolExecutor | None = None
        self._done = False
        self._finished = False
        self._lock = threading.Lock()

    # ----------------------------------------------------------------- writing files
    def file_path(self, name: str) -> Path:
        """Path inside the temporary folder where file `name` goes (parent folders are created)."""
        self._check_open()
        name = _check_name(name)
        previous = self._pending.pop(name, None)
        if previous is not None:
            previous.result()  # do not hash a file while it is being rewritten
            self._records.pop(name, None)
        path = self.tmp_dir / name
        path.parent.mkdir(parents=True, exist_ok=True)
        return path

    def add_file(self, name: str) -> None:
        """Record a file written into `tmp_dir` by other code (hooks, engines): fsync and checksum it."""
        self._check_open()
        name = _check_name(name)
        path = self.tmp_dir / name
        if not path.is_file():
            raise FileNotFoundError(f"add_file({name!r}): {path} does not exist or is not a file")
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="cadence-ckpt-hash")
        self._pending[name] = self._pool.submit(self._finish_file, path)

    def _finish_file(self, path: Path) -> FileRecord:
        if self.durable:
            fsync_file(path)
        return describe_file(path, self.checksum)

    def _finish_known(self, path: Path, record: FileRecord) -> FileRecord:
        if self.durable:
            fsync_file(path)
        return record

    def _add_known(self, name: str, path: Path, record: FileRecord) -> None:
        """Record a file whose size and checksum were computed from memory; fsync it meanwhile."""
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="cadence-ckpt-hash")
        self._pending[name] = self._pool.submit(self._finish_known, path, record)

    def save_bytes(self, name: str, data: bytes) -> Path:
        """Write `data` to the file `name` and record its size and checksum."""
        path = self.file_path(name)
        write_file_durably(path, data, durable=False)
        self._add_known(
            name, path, FileRecord(len(data), hash_view(memoryview(data), self.checksum))
        )
        return path

    def save_json(self, name: str, obj: Any) -> Path:
        """Write `obj` as JSON to the file `name` and record it."""
        return self.save_bytes(name, (json.dumps(obj, indent=1, sort_keys=True) + "\n").encode())

    def save_tensors(
        self, name: str, tensors: Mapping[str, Any], metadata: Mapping[str, str] | None = None
    ) -> Path:
        """A dict of tensors as safetensors (shared tensors are de-duplicated).

        Written straight from the tensors' memory and checksummed from memory in parallel.
        """

        path = self.file_path(name)
        if isinstance(tensors, Mapping) and supports_fast_write(tensors):
            clean, _ = dedupe_shared_tensors(tensors)
            meta = dict(SAFETENSORS_METADATA if metadata is None else metadata)
            size, checksum = write_tensor_file(path, clean, meta, self.checksum)
            self._add_known(name, path, FileRecord(size, checksum))
        else:
            write_safetensors(path, tensors, metadata=metadata)
            self.add_file(name)
        return path

    def save_object(self, name: str, obj: Any) -> Path:
        """Any state made of tensors and plain Python values, loadable with weights_only=True."""

        path = self.file_path(name)
        size, checksum = write_torch_hashed(path, obj, self.checksum)  # hashed while written
        self._add_known(name, path, FileRecord(size, checksum))
        return path

    # ----------------------------------------------------------------- finishing
    def rank_done(self) -> dict[str, FileRecord]:
        """Wait until this process's files are durable and hashed, then drop its marker."""
        with self._lock:
            if self._done:
                return dict(self._records)
            self._check_open()
            try:
                for name, future in self._pending.items():
                    self._records[name] = future.result()
            finally:
                self._pending.clear()
                if self._pool is not None:
                    self._pool.shutdown(wait=True)
                    self._pool = None
            marker = {
                "rank": self.rank,
                "checksum_algorithm": self.checksum,
                "files": {n: [r.size, r.checksum] for n, r in self._records.items()},
            }
            write_marker(self.tmp_dir / marker_name(self.rank), marker)
            self._done = True
            return dict(self._records)

    def commit(
        self,
        world_size: int = 1,
        *,
        ranks: Iterable[int] | None = None,
        timeout: float = 0.0,
        metadata: Mapping[str, Any] | None = None,
        remove_old_in_background: bool = False,
    ) -> Path:
        """Write the manifest and move the checkpoint into place. Only the committing process calls this.

        `ranks` are the processes whose files this folder holds (default: all of `world_size`); their
        markers must be present, or appear within `timeout` seconds (use a timeout when no barrier
        precedes the commit, e.g. from a background thread). An existing final folder is replaced
        atomically; entries in it that the new checkpoint does not write are kept, as with a plain
        save into an existing folder. With `remove_old_in_background`, the replaced folder (hidden
        already) is deleted by a background thread instead of before returning.
        """
        if not self.committer:
            raise CheckpointCommitError(
                f"Rank {self.rank} is not the committing process of {self.final_dir}; only the "
                "process created with committer=True (by default rank 0) may call commit().",
                path=self.final_dir,
            )
        if world_size < 1:
            raise ValueError(f"world_size must be >= 1, got {world_size}")
        expected = sorted(set(range(world_size) if ranks is None else ranks))
        self.rank_done()
        try:
            records = self._gather_records(expected, timeout)
            files = self._complete_records(records)
            # Each rank's own record (files another program added count as the committer's).
            owners = {n: records[n][0] if n in records else self.rank for n in files}
            own = dict(
                checksum_algorithm=self.checksum, world_size=world_size, metadata=metadata or {}
            )
            for name, part in rank_manifests(files, owners, expected, **own).items():
                write_file_durably(
                    self.tmp_dir / name, part.to_json().encode(), durable=self.durable
                )
            manifest = Manifest(
                files=files,
                checksum_algorithm=self.checksum,
                world_size=world_size,
                ranks=expected,
                metadata=dict(metadata or {}),
            )
            self._carry_over_existing(files)
            for marker in self.tmp_dir.glob(".cadence-rank-*.json"):
                marker.unlink()
            # The folder is not visible under its final name yet: write the manifest in place,
            # fsync it, then one fsync of the folder makes every entry durable before the rename.
            # Only the folder that holds rank 0 gets the folder manifest: when every process saves
            # into its own folder, Ray Train merges the folders by copying them concurrently into
            # one, and two copies of one name written at once tear it. Every other name in such
            # folders is a rank's own, and their per-rank manifests are their record.
            if 0 in expected:
                write_file_durably(
                    self.tmp_dir / MANIFEST_NAME, manifest.to_json().encode(), durable=self.durable
                )
            if self.durable:
                fsync_dir(self.tmp_dir)
            fence(self.final_dir.parent, "commit")  # a superseded worker exits here
            old = _publish(self.tmp_dir, self.final_dir, self.token)
            if self.durable:
                fsync_dir(self.final_dir.parent)
        finally:
            self._finish()
        if old is not None:
            # The commit stands. If the process dies before the removal, the hidden leftover is
            # removed by the next save's cleanup.
            if remove_old_in_background:
                remove_later(old)
            else:
                try:
                    remove_tree(old)
                except OSError as e:
                    logger.warning("Could not delete the replaced checkpoint %s: %s", old, e)
        return self.final_dir

    def abort(self) -> None:
        """Give up this save: delete the temporary folder (the previous checkpoint is untouched).

        Safe to call on several ranks at once and more than once.
        """
        with self._lock:
            for future in self._pending.values():
                future.cancel()
            self._pending.clear()
            if self._pool is not None:
                self._pool.shutdown(wait=True)
                self._pool = None
        try:
            remove_tree(self.tmp_dir)
        except OSError:
            remove_tree(self.tmp_dir)  # another rank was still adding files: once more
        self._finish()

    def rank_failed(self, error: BaseException) -> None:
        """Tell the committing process (which may wait in commit(timeout=...)) that this rank's part
        of the save failed, and why; the committer then fails at once instead of timing out."""
        with self._lock:
            for future in self._pending.values():
                future.cancel()
            self._pending.clear()
            if self._pool is not None:
                self._pool.shutdown(wait=True)
                self._pool = None
        info = {
            "rank": self.rank,
            "type": type(error).__name__,
            "errno": getattr(error, "errno", None),
            "message": str(error)[:2000],
        }
        try:
            write_marker(self.tmp_dir / failure_marker_name(self.rank), info)
        except OSError:
            pass  # the folder is gone (the committer gave up already) or the disk is full
        self._finish()

    def __enter__(self) -> CheckpointWriter:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None and not self._finished:
            self.abort()

    # ----------------------------------------------------------------- internals
    def _check_open(self) -> None:
        if self._done or self._finished:
            raise CheckpointError(
                f"The save of {self.final_dir} on rank {self.rank} is already finished; "
                "call begin_checkpoint() again for a new save.",
                path=self.final_dir,
            )

    def _finish(self) -> None:
        self._finished = True
        with _active_lock:
            _active_tmp_dirs.discard(str(self.tmp_dir))

    def _gather_records(
        self, ranks: list[int], timeout: float
    ) -> dict[str, tuple[int, FileRecord]]:
        return gather_rank_records(
            self.tmp_dir, self.final_dir, ranks, timeout, self.checksum, self.rank
        )

    def _complete_records(
        self, records: dict[str, tuple[int, FileRecord]]
    ) -> dict[str, FileRecord]:
        """Check recorded files on disk and add files that other code wrote without recording."""
        files: dict[str, FileRecord] = {}
        problems = []
        for name, (rank, record) in records.items():
            try:
                size = os.stat(self.tmp_dir / name).st_size
            except FileNotFoundError:
                problems.append(f"{name}: recorded by rank {rank} but missing from {self.tmp_dir}")
                continue
            if size != record.size:
                problems.append(
                    f"{name}: rank {rank} recorded {record.size} bytes, {size} on disk "
                    "(was it rewritten by another process?)"
                )
            files[name] = record
        if problems:
            raise CheckpointCommitError(
                describe_problems(f"Cannot commit checkpoint {self.final_dir}:", problems),
                path=self.final_dir,
                problems=problems,
            )
        for root, _dirs, names in os.walk(self.tmp_dir):
            if self.durable and Path(root) != self.tmp_dir:
                fsync_dir(root)  # entries of sub-folders (the top one is synced at commit)
            for fname in names:
                rel = (Path(root) / fname).relative_to(self.tmp_dir).as_posix()
                if rel in files or is_manifest_name(rel) or MARKER_RE.match(fname):
                    continue
                files[rel] = self._finish_file(self.tmp_dir / rel)
        return files

    def _carry_over_existing(self, files: Mapping[str, FileRecord]) -> None:
        """Keep entries of an existing final folder that this save does not write."""
        if not self.final_dir.is_dir():
            return
        try:
            previous = set(read_manifest(self.final_dir).files)
        except CheckpointError:
            previous = set()
        skip = {n.split("/")[0] for n in previous} | {MANIFEST_NAME}
        written = {n.split("/")[0] for n in files}
        for entry in self.final_dir.iterdir():
            if entry.name in skip or entry.name in written or is_manifest_name(entry.name):
                continue
            link_or_copy(entry, self.tmp_dir / entry.name)


def _publish(tmp_dir: Path, final_dir: Path, token: str) -> Path | None:
    """Move `tmp_dir` to `final_dir`; return the path holding the replaced folder, if any."""
    if not final_dir.exists():
        os.rename(tmp_dir, final_dir)
        return None
    if exchange_paths(tmp_dir, final_dir):
        return tmp_dir  # now holds the previous content
    # Two renames: a crash in between leaves `.NAME.old-TOKEN` and the complete `.NAME.tmp-TOKEN`,
    # which recover_interrupted_commit() rolls forward.
    old = final_dir.parent / f".{final_dir.name}.old-{token}"
    os.rename(final_dir, old)
    os.rename(tmp_dir, final_dir)
    return old


def begin_checkpoint(
    final_dir: str | os.PathLike,
    *,
    token: str | None = None,
    rank: int = 0,
    committer: bool | None = None,
    durable: bool = True,
    checksum: str | None = None,
) -> CheckpointWriter:
    """Start writing a checkpoint that will appear as `final_dir` when committed.

    All processes of one save must pass the same `token` (the main process makes one with
    new_token() and broadcasts it); a single process may leave it None. `committer` (default:
    rank == 0) marks the process that cleans leftovers of killed saves and later commits.
    `durable=False` skips fsync (for tests on throw-away folders). `checksum` defaults to
    xxh3_128 when `xxhash` is installed, else sha256; all ranks of one save must use the same.
    """
    final = _resolve_final(final_dir)
    token = new_token() if token is None else _check_token(token)
    checksum = default_checksum() if checksum is None else checksum
    new_hasher(checksum)  # unknown algorithm: fail before any side effect
    if not isinstance(rank, int) or rank < 0:
        raise ValueError(f"rank must be a non-negative int, got {rank!r}")
    committer = rank == 0 if committer is None else committer
    writer = CheckpointWriter(final, token, rank, committer, durable, checksum)
    with _active_lock:
        _active_tmp_dirs.add(str(writer.tmp_dir))
    try:
        final.parent.mkdir(parents=True, exist_ok=True)
        if committer:
            cleanup_stale_siblings(final.parent, name=final.name)
        writer.tmp_dir.mkdir(exist_ok=True)
    except BaseException:
        writer._finish()
        raise
    return writer


def recover_interrupted_commit(final_dir: str | os.PathLike) -> bool:
    """If replacing `final_dir` was interrupted between its two renames, finish it. True if it did."""
    final = Path(final_dir)
    if final.exists() or not final.parent.is_dir():
        return False
    olds, tmps = [], []
    for entry in final.parent.iterdir():
        m = _SIBLING_RE.match(entry.name)
        if m and m["name"] == final.name and str(entry) not in _active_tmp_dirs:
            (olds if m["kind"] == "old" else tmps if m["kind"] == "tmp" else []).append(entry)
    if not olds:
        return False

    candidates = [t for t in tmps if is_complete(t)] or [o for o in olds if is_complete(o)] or olds
    candidates.sort(key=lambda p: p.stat().st_mtime)
    os.rename(candidates[-1], final)
    fsync_dir(final.parent)
    logger.warning("Recovered %s from an interrupted save (%s).", final, candidates[-1].name)
    return True


def cleanup_stale_siblings(parent: str | os.PathLike, name: str | None = None) -> list[Path]:
    """Delete leftovers of killed saves in `parent` (for one folder `name`, or all).

    Temporary folders of saves still running in this process are kept; an interrupted replacement
    is first rolled forward so the checkpoint it was replacing is not lost.
    """
    parent = Path(parent)
    if not parent.is_dir():
        return []
    names = set()
    stale = []
    for entry in parent.iterdir():
        m = _SIBLING_RE.match(entry.name)
        if m is None or (name is not None and m["name"] != name):
            continue
        names.add(m["name"])
    for n in names:
        recover_interrupted_commit(parent / n)
    with _active_lock:
        active = set(_active_tmp_dirs)
    for entry in parent.iterdir():
        m = _SIBLING_RE.match(entry.name)
        if m is None or (name is not None and m["name"] != name) or str(entry) in active:
            continue
        remove_tree(entry)
        stale.append(entry)
    if stale:
        logger.info("Removed %d leftover(s) of interrupted saves in %s", len(stale), parent)
    return stale
