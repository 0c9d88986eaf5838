"""Tell the other ranks when this one ends: an uncaught exception (sys.excepthook) or a normal exit.

A failure is recorded as the job's reason to stop (unless another rank's came first), so the peers'
watchdogs stop them within a tick, naming this rank and its exception. A rank that fails *because* a
peer failed first (its collective lost the connection) says so, in one line instead of a traceback.
"""

from __future__ import annotations

import atexit
import re
import sys
import time
from collections.abc import Callable
from typing import Any

from ..core.settings import resolve_flag
from . import stopping
from .callsite import describe_frame, is_user_file
from .stopping import describe_reason, write_error_file
from .verdict import rank_list

_installed = False
_previous_excepthook = sys.excepthook
# Returns this process's running watchdog (or None); given by the watchdog when it installs the hooks.
_active_watchdog: Callable[[], Any] = lambda: None  # noqa: E731
# How a collective fails when a peer went away: a consequence, not a cause.
_LOST_PEER = re.compile(
    r"Connection closed by peer|Connection reset|Broken pipe|DistBackendError|DistNetworkError|"
    r"recvBytes|sendBytes|failed to recv|peer closed|Connection refused|NCCL communicator was aborted",
    re.IGNORECASE,
)


def install_hooks(active_watchdog: Callable[[], Any]) -> None:
    """Install the fail-fast excepthook and exit hook; `active_watchdog()` gives the running watchdog."""
    global _installed, _previous_excepthook, _active_watchdog
    _active_watchdog = active_watchdog
    if _installed:
        return
    _installed = True
    _previous_excepthook = sys.excepthook
    sys.excepthook = _on_uncaught_exception
    atexit.register(_on_exit)


def _failure_site(traceback: Any) -> str:
    site = None
    while traceback is not None:
        if is_user_file(traceback.tb_frame.f_code.co_filename):
            site = describe_frame(traceback.tb_frame).rsplit(":", 1)[0] + f":{traceback.tb_lineno}"
        traceback = traceback.tb_next
    return site or ""


def _one_line(error_type: type, error: BaseException, limit: int = 300) -> str:
    text = f"{error_type.__name__}: {error}".strip().splitlines()
    line = text[0] if text else error_type.__name__
    return line if len(line) <= limit else line[: limit - 3] + "..."


def announce_failure(error_type: type, error: BaseException, traceback: Any) -> str | None:
    """Record this rank's failure for the others. Returns a line to print instead of the traceback
    when the failure is only a consequence (its collective lost a peer that ended), else None."""
    watchdog = _active_watchdog()
    if watchdog is None or watchdog.final_phase is not None:
        return None
    summary = _one_line(error_type, error)
    site = _failure_site(traceback)
    watchdog.publish_final({"phase": "failed", "error": summary, "failed_at": site})
    if _LOST_PEER.search(f"{error_type.__name__} {error}"):
        # Never the root cause: name the rank that failed first when it said so.
        first = watchdog.channel.stop_reason()
        if first is not None and first.get("rank") != watchdog.rank:
            cause = describe_reason(first)
        else:
            cause = _who_ended(watchdog)
        return (
            f"[rank {watchdog.rank}] stopped because {cause}; this rank's collective lost its "
            f"connection: {summary}"
        )
    reason = {"kind": "failed", "rank": watchdog.rank, "error": summary, "site": site}
    first = watchdog.channel.claim_stop({**reason, "time": time.time()})
    if first.get("rank") == watchdog.rank:
        _leave_error_file(error_type, error, traceback)
    return None


def _who_ended(watchdog: Any) -> str:

    states = watchdog.channel.states(watchdog.world_size)
    ended = [
        rank
        for rank, state in enumerate(states)
        if rank != watchdog.rank and state and state.get("phase") == "exited"
    ]
    if ended:
        last = {states[rank].get("done") for rank in ended}
        return f"{rank_list(ended)} ended (the script returned) after call #{max(last)}"
    return "another rank ended (killed, or crashed outside Python)"


def _leave_error_file(error_type: type, error: BaseException, traceback: Any) -> None:
    import traceback as tb

    details = "".join(tb.format_exception(error_type, error, traceback))
    write_error_file(_one_line(error_type, error), details, error_type.__name__)


def _on_uncaught_exception(error_type: type, error: BaseException, traceback: Any) -> None:
    consequence = None
    try:
        consequence = announce_failure(error_type, error, traceback)
    except Exception:  # noqa: BLE001 - reporting must never hide the user's own error
        pass
    if consequence is None:
        _previous_excepthook(error_type, error, traceback)
        return

    if not stopping.announced:  # the watchdog may have said why this rank stops already
        print(consequence, file=sys.stderr, flush=True)
    if _debug():
        _previous_excepthook(error_type, error, traceback)
    stopping.let_launcher_stop_us_first()


def _debug() -> bool:

    return resolve_flag("debug").value


def _on_exit() -> None:
    watchdog = _active_watchdog()
    if watchdog is None:
        return
    try:
        if watchdog.final_phase is None:
            watchdog.publish_final({"phase": "exited"})
    except Exception:  # noqa: BLE001 - the store may be gone already
        pass
    watchdog.halt()
    watchdog.release()
