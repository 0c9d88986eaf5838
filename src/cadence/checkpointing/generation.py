"""Fencing: a worker of an older restart generation never commits, renames or deletes checkpoints.

A worker frozen during a save (a paused VM) can wake up after the job restarted without it and
committed newer checkpoints. Each commit and each pruning first compares this worker's generation
(``CADENCE_RESTART_GENERATION``: the rendezvous round it was started in, see
diagnostics/generation_env.py) with the newest one recorded next to the checkpoints
(``.cadence-generation``); an older worker says it was superseded and exits with
`SUPERSEDED_EXIT_CODE`, touching nothing. A newer one records itself. Generation 0 (a job that never
restarted) writes nothing. The check and the rename that follows are not one atomic step: a worker
that wakes in between those two system calls can still commit once.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from ..core.settings import env_text
from ..diagnostics.generation_env import GENERATION_ENV

GENERATION_FILE = ".cadence-generation"
SUPERSEDED_EXIT_CODE = 76


def _mine() -> int | None:
    text = env_text(GENERATION_ENV)
    return int(text) if text and text.strip().isdigit() else None


def recorded_generation(directory: str | os.PathLike) -> int:
    """The newest generation recorded in `directory` (-1 when none is)."""
    try:
        text = (Path(directory) / GENERATION_FILE).read_text(encoding="utf-8").strip()
    except OSError:
        return -1
    return int(text) if text.isdigit() else -1


def fence(directory: str | os.PathLike, action: str) -> None:
    """Before `action` (commit, prune) in `directory`: exit if a newer generation has started there,
    record this generation if it is the newest."""
    mine = _mine()
    if mine is None:
        return
    recorded = recorded_generation(directory)
    if recorded > mine:
        message = (
            f"Cadence: this worker (pid {os.getpid()}, rank {env_text('RANK', '?')}) belongs to "
            f"restart generation {mine}, but generation {recorded} of the job has started since and "
            f"writes in {directory}; it was superseded, so it does not {action} anything there and "
            f"exits (code {SUPERSEDED_EXIT_CODE})."
        )
        try:
            os.write(2, (message + "\n").encode(errors="replace"))
        except OSError:
            pass
        # Not an exception: a `finally` or an error handler must not get to write either.
        os._exit(SUPERSEDED_EXIT_CODE)
    # A folder not made yet (the job's first save) holds nothing to fence: the commit that makes it
    # records the generation.
    if mine > recorded and mine > 0 and Path(directory).is_dir():
        path = Path(directory) / GENERATION_FILE
        tmp = path.with_name(f"{GENERATION_FILE}.{os.getpid()}.tmp")
        try:
            tmp.write_text(str(mine), encoding="utf-8")
            os.replace(tmp, path)
        except OSError as error:
            print(
                f"Cadence: could not record generation {mine} in {directory}: {error}",
                file=sys.stderr,
            )
