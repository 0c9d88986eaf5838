"""Stop this process because the job cannot go on: say why on stderr, leave an error file, exit now.

Called from the watchdog thread while the main thread may be blocked inside the backend, so the process
ends with `os._exit` (nothing waits for the blocked thread) and the message goes out with `os.write`.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any, NoReturn

from ..core.settings import env_text

STOP_EXIT_CODE = 1
ERROR_FILE_ENV = "TORCHELASTIC_ERROR_FILE"
# Under a launcher (torch elastic agent) a rank that only follows another's failure waits this long for
# the launcher to stop it, so the launcher sees the failing rank end first and names it as the cause.
FOLLOW_GRACE = 3.0
announced = False  # this process has said why it stops


def let_launcher_stop_us_first() -> None:
    """Under torchrun, wait a grace period so the launcher can stop this rank first.

    Only where the launcher runs other workers: it compares the ends of its own workers, so a rank
    alone on its node (a peer on another node failed or died) has nothing to wait for, and waiting
    would only delay the job's restart."""
    local = env_text("LOCAL_WORLD_SIZE") or ""
    if env_text("TORCHELASTIC_RUN_ID") and not (local.isdigit() and int(local) <= 1):
        time.sleep(FOLLOW_GRACE)


def describe_reason(reason: dict[str, Any]) -> str:
    """Why the job stops, in words: "rank 2 failed: RuntimeError: ... at train.py:11" and the like."""
    kind, origin = reason.get("kind"), reason.get("rank")
    if kind == "failed":
        site = f" at {reason['site']}" if reason.get("site") else ""
        return f"rank {origin} failed: {reason.get('error')}{site}"
    if kind == "report":
        return f"rank {origin} found that the job cannot go on: {reason.get('headline')}"
    return f"rank {origin}: {reason.get('headline', 'unknown reason')}"


def stop_message(rank: int, reason: dict[str, Any], reporter: bool) -> str:
    """The message printed when this rank is stopped for `reason`."""
    if reporter and reason.get("kind") == "report":
        return f"[rank {rank}] {reason['report']}"
    if reporter:
        return f"[rank {rank}] Cadence stops this rank: {reason.get('headline', 'unknown reason')}."
    return f"[rank {rank}] Cadence stops this rank because {describe_reason(reason)}."


def write_error_file(message: str, details: str, exception: str) -> None:
    """The JSON file torch elastic (and `cadence launch`) read to report a worker's failure; a file
    already written (by `cadence launch`'s worker bootstrap) is left alone."""
    path = env_text(ERROR_FILE_ENV)
    if not path or os.path.exists(path):
        return
    now = time.time()
    data = {
        "message": {
            "message": message,
            "extraInfo": {"py_callstack": details, "timestamp": str(int(now))},
        },
        "cadence": {"time": now, "exception": exception, "rank": env_text("RANK")},
    }
    try:
        with open(path, "w", encoding="utf-8") as handle:
            json.dump(data, handle)
    except OSError:
        pass


def flush_output() -> None:
    """Flush what the script printed so far (before an `os._exit` or a raw write to stderr)."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError, AttributeError):
            pass


def print_report(message: str) -> None:
    """Write a report to stderr from the watchdog thread, after what the script printed so far."""
    flush_output()
    try:
        os.write(2, (message + "\n").encode(errors="replace"))
    except OSError:
        pass


def stop_process(rank: int, reason: dict[str, Any], reporter: bool) -> NoReturn:
    """Report why this rank stops, write its error file if it reports, and exit."""
    global announced
    announced = True
    message = stop_message(rank, reason, reporter)
    print_report(message)  # after what the script printed so far, which must not be lost
    if reporter:  # the launcher's summary names the reporting rank; the others only follow
        write_error_file(
            f"CollectiveStuck: {reason.get('headline', '')}", message, "CollectiveStuck"
        )
    else:
        let_launcher_stop_us_first()
    os._exit(STOP_EXIT_CODE)
