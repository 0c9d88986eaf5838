"""The delays of the stuck-rank check, from code, environment or launch config, validated up front.

Two delays: after ``stall_report`` seconds (default 30) of a rank waiting in a collective that another
rank has not joined, one report says where every rank is, and the job goes on; after the stuck timeout
(default 300 s; for barriers, the process-group timeout unless chosen) every rank stops with a report.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

DEFAULT_STUCK_TIMEOUT = 300.0
STUCK_TIMEOUT_ENV = "CADENCE_STUCK_TIMEOUT"
DEFAULT_STALL_REPORT = 30.0
STALL_REPORT_ENV = "CADENCE_STALL_REPORT"
# Beyond this a delay is a typo (1e400 would be infinity): a week.
MAX_SECONDS = 7 * 24 * 3600.0
# Collectives whose whole point is to wait for slower ranks (a rank saving a checkpoint, the main
# process preparing data in main_process_first): with the default stuck timeout they are allowed the
# process-group timeout, as they would be without Cadence; an explicit stuck timeout applies to them too.
BARRIER_OPERATIONS = frozenset({"wait_for_everyone"})
HOW_TO_CHANGE = (
    "CADENCE_STUCK_TIMEOUT=<seconds>, InitProcessGroupKwargs(stuck_timeout=...) or `stuck_timeout` in "
    "the launch config"
)


def parse_seconds(value: Any, source: str, upper: float = MAX_SECONDS) -> float | None:
    """Seconds from a number, numeric string or timedelta; 0 (or "off") turns the check off (None)."""
    if isinstance(value, timedelta):
        seconds = value.total_seconds()
    elif isinstance(value, str) and value.strip().lower() in ("off", "none", "no"):
        return None
    else:
        try:
            seconds = float(value)
        except (TypeError, ValueError):
            raise ValueError(
                f"{source}={value!r} is not a number of seconds. Give e.g. 300, or 0 to turn the "
                "check off."
            ) from None
    if seconds != seconds or seconds < 0:  # NaN or negative
        raise ValueError(
            f"{source}={value!r} must be a positive number of seconds (0 turns it off)."
        )
    if not math.isfinite(seconds) or seconds > upper:
        raise ValueError(
            f"{source}={value!r} is more than {upper:g} seconds; give a number of seconds such as "
            "300, or 0 to turn the check off."
        )
    return seconds or None


@dataclass(frozen=True)
class WatchSettings:
    # None: no stuck-rank reports (mismatches and failures still stop the job).
    """Timeouts of the watchdog: stuck-rank stop, process group and stall report."""

    stuck_timeout: float | None
    explicit: bool  # the user chose the stuck timeout
    process_group_timeout: float
    # Seconds of waiting after which one report (not a stop) says where every rank is; None: never.
    stall_report: float | None = DEFAULT_STALL_REPORT

    @property
    def tick(self) -> float:
        """How often each rank publishes its state and looks at the others'."""
        delays = [d for d in (self.stuck_timeout, self.stall_report) if d is not None]
        if not delays:
            return 1.0
        return min(1.0, max(0.05, min(delays) / 4))

    @property
    def grace(self) -> float:
        """How long a rank waits in a collective before it looks at the other ranks at all."""
        return max(2 * self.tick, 1.0)

    def deadline(self, operation: str, entry_timeout: float | None) -> float | None:
        """Seconds a rank may wait in `operation` before the job is declared stuck (None: never)."""
        if entry_timeout is not None:  # wait_for_everyone(timeout=...): the backend raises then
            return entry_timeout + self.grace
        if self.stuck_timeout is None:
            return None
        if operation in BARRIER_OPERATIONS and not self.explicit:
            return max(self.stuck_timeout, self.process_group_timeout)
        return self.stuck_timeout

    def out_of_step_after(self, deadline: float | None) -> float:
        """Ranks in different calls may be a big transfer finishing: wait a little before judging."""
        return max(self.grace, min(30.0, deadline if deadline is not None else 30.0))


def resolve_watch_settings(
    explicit: Any,
    launch: dict[str, Any],
    process_group_timeout: float = 1800.0,
    env: dict[str, str] | None = None,
) -> WatchSettings:
    """Stuck timeout: code (InitProcessGroupKwargs / PartialState kwarg) > CADENCE_STUCK_TIMEOUT >
    launch config > 300 s. Stall report: CADENCE_STALL_REPORT > `stall_report` in the launch config > 30 s."""
    env = os.environ if env is None else env
    stall: float | None = DEFAULT_STALL_REPORT
    for value, source in (
        (env.get(STALL_REPORT_ENV), STALL_REPORT_ENV),
        (launch.get("stall_report"), "stall_report (launch config)"),
    ):
        if value is not None and value != "":
            stall = parse_seconds(value, source)
            break
    for value, source in (
        (explicit, "stuck_timeout"),
        (env.get(STUCK_TIMEOUT_ENV), STUCK_TIMEOUT_ENV),
        (launch.get("stuck_timeout"), "stuck_timeout (launch config)"),
    ):
        if value is not None and value != "":
            return WatchSettings(parse_seconds(value, source), True, process_group_timeout, stall)
    return WatchSettings(DEFAULT_STUCK_TIMEOUT, False, process_group_timeout, stall)
