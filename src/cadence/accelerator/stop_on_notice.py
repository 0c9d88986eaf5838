"""Arm the graceful stop on notice for one Accelerator (see diagnostics/stop_notice.py).

With automatic checkpoint naming (a `project_dir` and `automatic_checkpoint_naming=True`) a stop
notice becomes one `save_state()` at the step boundary every rank agreed on, then exit code
`RESUME_EXIT_CODE`. Without it the notice stops the job as before; under an elastic launch that is
said once at start, since every membership change then redoes the steps since the last save.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

from ..core.settings import env_text
from ..diagnostics.stop_notice import RESUME_EXIT_CODE, notice


def _elastic_launch() -> bool:
    restarts = env_text("TORCHELASTIC_MAX_RESTARTS", "0") or "0"
    return restarts.isdigit() and int(restarts) > 0


def arm_stop_on_notice(
    save_state: Callable[[], Any],
    wait_for_save: Callable[[], Any],
    project_config: Any,
    process_index: int,
    num_processes: int,
    finish_trackers: Callable[[], Any] | None = None,
) -> bool:
    """Install the notice handler that checkpoints with `save_state()`; returns whether it did.

    After the checkpoint, `finish_trackers()` closes this process's trackers: the process then ends
    at once (no atexit handlers run), and a tracker's run must not be left open or unflushed.
    """
    automatic = bool(getattr(project_config, "automatic_checkpoint_naming", False))
    if not (automatic and getattr(project_config, "project_dir", None)):
        if process_index == 0 and _elastic_launch():
            print(
                "Cadence: no project_dir with automatic_checkpoint_naming=True, so a stop notice "
                "(a scheduler's SIGTERM, or a node leaving or joining) cannot become a checkpoint: "
                "the steps since your last save_state will be redone after a restart",
                file=sys.stderr,
                flush=True,
            )
        return False

    def checkpoint_and_stop() -> None:
        path = save_state()
        wait_for_save()
        if finish_trackers is not None:
            try:
                finish_trackers()
            except Exception as e:  # the checkpoint stands; a tracker must not keep the job alive
                print(
                    f"Cadence: stop notice: finishing the trackers failed: {e!r}", file=sys.stderr
                )
        if process_index == 0:
            print(
                f"Cadence: stop notice: checkpoint {path} committed after step {notice.completed}; "
                f"exiting with code {RESUME_EXIT_CODE} (resume me)",
                file=sys.stderr,
                flush=True,
            )

    # Without a watchdog (one process, or CADENCE_LEDGER=0) there is no channel to agree through:
    # the noticed process stops alone at its next boundary.
    solo = num_processes == 1
    if not solo:
        from ..diagnostics.watchdog import (  # deferred: the watchdog loads only on several processes
            active_watchdog,
        )

        solo = active_watchdog() is None
    owner = getattr(save_state, "_owner", None)  # a weakly() callback: its Accelerator may go
    alive = (lambda: owner() is not None) if owner is not None else (lambda: True)
    return notice.install(checkpoint_and_stop, solo=solo, alive=alive) is not None
