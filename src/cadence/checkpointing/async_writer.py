"""Asynchronous saving: copy the state to CPU memory, write and commit it in a background thread.

Training is blocked only for the copy. The commit rules are unchanged (files, then the manifest,
then the rename), so a process killed while the thread writes leaves the previous checkpoint
intact. One save runs at a time: `wait()` (called by the next save and at the end of training)
blocks until the previous one is committed and re-raises its error, if it had one.

    saver = AsyncCheckpointSaver()
    saver.wait()
    files = saver.snapshot({"model.safetensors": weights, "optimizer.bin": optim_state})
    writer = begin_checkpoint(final_dir, token=token, rank=rank)
    saver.submit(write_and_commit, writer, files, world_size=n, commit=rank == 0, timeout=600)

`submit_deferred(live_files, write_and_commit, writer, ...)` makes the copy in the background too
and returns at once; the caller then calls `fence()` before the next in-place update of those
tensors (before optimizer.step()).

No collective runs in the thread: the committing process waits for the other ranks' markers.
"""

from __future__ import annotations

import concurrent.futures.thread  # noqa: F401  # its exit hook must be registered before ours
import copy
import logging
import os
import sys
import threading
import weakref
from collections.abc import Callable, Mapping
from typing import Any

from .atomic import CheckpointWriter
from .space import as_space_error, ensure_space, estimate_bytes

logger = logging.getLogger(__name__)


def write_files(writer: CheckpointWriter, files: Mapping[str, Any]) -> None:
    """Write `{file name: payload}` with the writer: `.safetensors` names hold a dict of tensors,
    `.json` names a JSON value, bytes are written as they are, anything else through torch.save.
    A payload may also be a pair `("weights" | "object", state)` naming its kind explicitly.

    Largest first: each file's fsync runs in the background while the next one is written, so
    the one fsync left to wait for at the end is that of a small file."""
    order = sorted(files, key=lambda n: -estimate_bytes({n: files[n]}))
    for name in order:
        payload = files[name]
        kind = None
        if isinstance(payload, tuple) and len(payload) == 2 and payload[0] in ("weights", "object"):
            kind, payload = payload
        if kind == "weights" or (kind is None and name.endswith(".safetensors")):
            writer.save_tensors(name, payload, metadata={"format": "pt"})
        elif kind is None and name.endswith(".json"):
            writer.save_json(name, payload)
        elif kind is None and isinstance(payload, (bytes, bytearray, memoryview)):
            writer.save_bytes(name, bytes(payload))
        else:
            writer.save_object(name, payload)


def write_rank_files(writer: CheckpointWriter, files: Mapping[str, Any]) -> None:
    """Write this rank's files and mark them done (fsynced, checksummed).

    Free space is checked first where the size is known; a full disk raises OSError(ENOSPC) naming
    the folder, the MB needed and free, whatever the serializer reported. On failure nothing is
    cleaned here: the caller decides (abort() alone, or after telling the other ranks).
    """
    needed = estimate_bytes(files)
    try:
        ensure_space(writer.tmp_dir, needed)
        write_files(writer, files)
        writer.rank_done()
    except BaseException as e:
        replacement = as_space_error(e, writer.tmp_dir.parent, needed)
        if replacement is not None:
            raise replacement from e
        raise


def commit_checkpoint(
    writer: CheckpointWriter,
    *,
    world_size: int = 1,
    ranks=None,
    timeout: float = 0.0,
    metadata: Mapping[str, Any] | None = None,
    after_commit: Callable[[], Any] | None = None,
    remove_old_in_background: bool = False,
) -> None:
    """On the committing rank: write the manifest and move the checkpoint into place (full disk ->
    OSError(ENOSPC)), then run `after_commit` (e.g. rotation)."""
    try:
        writer.commit(
            world_size,
            ranks=ranks,
            timeout=timeout,
            metadata=metadata,
            remove_old_in_background=remove_old_in_background,
        )
    except BaseException as e:
        replacement = as_space_error(e, writer.tmp_dir.parent, 1 << 20)
        if replacement is not None:
            raise replacement from e
        raise
    if after_commit is not None:
        after_commit()


def write_and_commit(
    writer: CheckpointWriter,
    files: Mapping[str, Any],
    *,
    commit: bool,
    world_size: int = 1,
    ranks=None,
    timeout: float = 0.0,
    metadata: Mapping[str, Any] | None = None,
    after_commit: Callable[[], Any] | None = None,
    remove_old_in_background: bool = False,
) -> None:
    """Write this rank's files, mark them done, and (on the committing rank) commit, then run
    `after_commit` (e.g. rotation). Needs no collective, so it runs in a background thread too.

    On failure the temporary folder is removed (committing rank), or (other ranks) a failure
    marker tells the committing rank, which then fails at once with this rank's error instead of
    waiting for `timeout`. The previous checkpoint is untouched either way.
    """
    try:
        write_rank_files(writer, files)
        if commit:
            commit_checkpoint(
                writer,
                world_size=world_size,
                ranks=ranks,
                timeout=timeout,
                metadata=metadata,
                after_commit=after_commit,
                remove_old_in_background=remove_old_in_background,
            )
    except BaseException as e:
        if commit or world_size == 1:
            writer.abort()  # this save is lost either way; the previous checkpoint stays
        else:
            writer.rank_failed(e)
        raise


class _Staging:
    """CPU buffers reused from one snapshot to the next (fresh memory costs page faults)."""

    def __init__(self) -> None:
        self._buffers: dict[tuple, Any] = {}
        self._used: set[tuple] = set()

    def copy(self, key: tuple, tensor, non_blocking: bool):
        import torch

        pin = tensor.device.type == "cuda"
        buf = self._buffers.get(key)
        if (
            buf is None
            or buf.shape != tensor.shape
            or buf.dtype != tensor.dtype
            or buf.is_pinned() != pin
            or key in self._used
        ):
            buf = torch.empty(tensor.shape, dtype=tensor.dtype, device="cpu", pin_memory=pin)
            self._buffers[key] = buf
        self._used.add(key)
        buf.copy_(tensor.detach(), non_blocking=pin and non_blocking)
        return buf

    def finish(self) -> None:
        for key in set(self._buffers) - self._used:
            del self._buffers[key]  # drop buffers of state that no longer exists
        self._used.clear()


_live_savers: weakref.WeakSet = weakref.WeakSet()
_exit_hook_registered = False
_exit_hook_lock = threading.Lock()


def _finish_pending_saves() -> None:
    """At interpreter exit, before thread pools refuse new work: let every pending save commit.

    A save that fails here has nobody left to raise to: say so on stderr and end the process
    with status 1, so a scheduler sees that the last checkpoint was not written.
    """
    failed = []
    for saver in list(_live_savers):
        try:
            saver.wait()
        except BaseException as e:  # reported below
            failed.append(e)
    if failed:
        for e in failed:
            print(
                f"cadence: the asynchronous checkpoint save pending at exit failed and was not "
                f"committed: {type(e).__name__}: {e}",
                file=sys.stderr,
                flush=True,
            )
        os._exit(1)


def _register_exit_hook() -> None:
    """Register _finish_pending_saves once. threading runs its exit hooks in reverse order of
    registration, and concurrent.futures registered its own (which makes every executor refuse
    new futures) when it was imported, above: ours runs first, while the writers' pools work."""
    global _exit_hook_registered
    with _exit_hook_lock:
        if _exit_hook_registered:
            return
        register = getattr(threading, "_register_atexit", None)
        if register is None:  # no such hook (other interpreters): the non-daemon thread remains
            return
        try:
            register(_finish_pending_saves)
        except RuntimeError:  # already shutting down: the caller's thread is joined anyway
            return
        _exit_hook_registered = True


class AsyncCheckpointSaver:
    """Runs at most one save at a time in a background thread; a save still running when the
    interpreter exits commits first (or the process exits with status 1 saying why)."""

    def __init__(self) -> None:
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self._staging = _Staging()
        self._cuda_event = None
        self._staged: threading.Event | None = None

    @property
    def in_progress(self) -> bool:
        """Whether a background save is still running."""
        return self._thread is not None and self._thread.is_alive()

    def snapshot(self, state: Any) -> Any:
        """A copy of `state` whose tensors live in CPU memory, safe to write while training goes on.

        Tensors sharing memory stay shared in the copy. Call wait() first: buffers of the previous
        snapshot are reused.
        """
        if self.in_progress:
            raise RuntimeError("snapshot() while a save is running: call wait() first.")
        result, uses_cuda = self._copy(state, non_blocking=True)
        if uses_cuda:
            import torch

            # Copies were queued on the current stream; the writer thread waits for this event,
            # and later in-place updates on the stream run after the copies.
            self._cuda_event = torch.cuda.Event()
            self._cuda_event.record()
        return result

    def _copy(self, state: Any, non_blocking: bool) -> tuple[Any, bool]:
        import torch

        seen: dict[int, Any] = {}
        uses_cuda = False

        def walk(obj: Any, path: tuple) -> Any:
            nonlocal uses_cuda
            if isinstance(obj, torch.Tensor):
                if id(obj) in seen:
                    return seen[id(obj)]
                uses_cuda |= obj.device.type == "cuda"
                out = self._staging.copy(path, obj, non_blocking)
                seen[id(obj)] = out
                return out
            if isinstance(obj, Mapping):
                items = [(k, walk(v, (*path, k))) for k, v in obj.items()]
                try:
                    return type(obj)(items)
                except TypeError:
                    return dict(items)
            if isinstance(obj, tuple) and hasattr(obj, "_fields"):
                return type(obj)(*(walk(v, (*path, i)) for i, v in enumerate(obj)))
            if isinstance(obj, (list, tuple)):
                return type(obj)(walk(v, (*path, i)) for i, v in enumerate(obj))
            if obj is None or isinstance(obj, (bool, int, float, str, bytes, torch.dtype)):
                return obj
            return copy.deepcopy(obj)

        result = walk(state, ())
        self._staging.finish()
        return result, uses_cuda

    def submit(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
        """Run fn(*args, **kwargs) in the background after the previous save finished."""
        self.wait()
        event, self._cuda_event = self._cuda_event, None
        self._start(fn, args, kwargs, before=event.synchronize if event is not None else None)

    def submit_deferred(
        self, live_state: Any, fn: Callable[..., Any], *args: Any, **kwargs: Any
    ) -> None:
        """Like submit(fn, *args, snapshot(live_state), **kwargs) (the copy goes last among the
        positional arguments), but the copy is made by the background thread, so this returns at
        once. For example: submit_deferred(files, write_and_commit, writer, commit=True).

        Until fence() returns, `live_state`'s tensors must not change in place: call fence() before
        the next optimizer.step(). Tensors that change earlier (buffers updated by forward) belong
        in a snapshot() passed through `args` instead.
        """
        self.wait()
        staged = threading.Event()
        self._staged = staged
        holder: list[Any] = []

        def copy_first() -> None:
            try:
                holder.append(self._copy(live_state, non_blocking=False)[0])
            except BaseException:
                for arg in args:  # the save will not happen: drop its temporary folder
                    if isinstance(arg, CheckpointWriter):
                        arg.abort()
                raise
            finally:
                staged.set()

        self._start(lambda: fn(*args, holder[0], **kwargs), (), {}, before=copy_first)

    def fence(self) -> None:
        """Block until the background copy of submit_deferred's state is made (at once if none)."""
        if self._staged is not None:
            self._staged.wait()

    def _start(self, fn, args, kwargs, before) -> None:
        def run() -> None:
            try:
                if before is not None:
                    before()
                fn(*args, **kwargs)
            except BaseException as e:  # kept for wait(); logged in case nobody waits
                self._error = e
                logger.error("Asynchronous checkpoint save failed: %s", e)

        # Not a daemon, and waited for by an exit hook that runs before concurrent.futures stops
        # accepting work: an interpreter exiting normally commits the save before it stops.
        _register_exit_hook()
        _live_savers.add(self)
        self._thread = threading.Thread(target=run, name="cadence-async-save", daemon=False)
        self._thread.start()

    def wait(self) -> None:
        """Block until the running save (if any) is done; raise its error here."""
        thread = self._thread
        if thread is not None:
            thread.join()
            self._thread = None
        self._staged = None
        if self._error is not None:
            error, self._error = self._error, None
            if hasattr(error, "add_note"):
                error.add_note("(raised by the previous asynchronous checkpoint save)")
            raise error
