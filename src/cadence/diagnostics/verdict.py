"""Decide from every rank's published state whether the job can still make progress, and say why not.

Pure functions over plain dicts, so the rules can be read (and tested) without processes. A rank's state:
``rank, beat`` (wall time it was published), ``phase`` ("running", "collective", "exited", "failed"),
``seq, op, shapes, site, since, timeout`` (the collective it waits in), ``done`` (last finished call
number), ``last_op``, ``where`` (where its main thread is), ``error`` (when it failed).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .settings import HOW_TO_CHANGE, WatchSettings

# Collectives whose inputs must have the same shapes on every rank (the others may differ legitimately).
SAME_SHAPES = frozenset({"gather", "reduce", "broadcast"})
# Seconds without a heartbeat after which a rank counts as frozen (GIL held) or its machine overloaded.
STALE_AFTER = 15.0


@dataclass
class Verdict:
    """The diagnosis of a failed or stuck job: its kind, headline, report and culprit ranks."""

    kind: str  # mismatch | out_of_step | ended | stuck | backend
    headline: str
    report: str
    culprits: list[int] = field(default_factory=list)


def rank_list(ranks: list[int]) -> str:
    """[0, 2, 3] -> "ranks 0, 2, 3"; long consecutive runs become "ranks 0-63"."""
    ranks = sorted(ranks)
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    parts, start = [], 0
    for i in range(1, len(ranks) + 1):
        if i == len(ranks) or ranks[i] != ranks[i - 1] + 1:
            run = ranks[start:i]
            parts.append(f"{run[0]}-{run[-1]}" if len(run) >= 3 else ", ".join(map(str, run)))
            start = i
    return "ranks " + ", ".join(parts)


def _is_stale(state: dict[str, Any], now: float, tick: float) -> bool:
    return now - state.get("beat", now) > max(STALE_AFTER, 5 * tick)


# Where a rank's time in its collective goes in its details: ranks in the same collective at the
# same place are one group however long each has waited (their times become a range).
_WAITED = "<waited>"


def _what(state: dict[str, Any] | None, now: float, tick: float) -> tuple[str, str]:
    """(short description for the headline, details) of one rank; in the details of a rank in a
    collective, `_WAITED` stands for how long it has waited (see `_waited`)."""
    if state is None:
        text = "has not reported (still starting, or it does not use Cadence)"
        return text, text
    phase = state.get("phase")
    last = (
        f"last call: {state['last_op']} #{state['done']}" if state.get("last_op") else "no call yet"
    )
    if phase == "collective":
        short = f"in {state['op']} #{state['seq']} at {state['site']}"
        detail = f"{short} with {state['shapes']}" if state.get("shapes") else short
        detail += f", for {_WAITED} s"
    elif phase == "exited":
        short = detail = f"has exited (its script ended; {last})"
    elif phase == "failed":
        short = detail = f"failed: {state.get('error', 'an exception')}"
    else:
        short = f"is at {state.get('where', '<unknown>')} (not in a collective)"
        detail = f"{short[:-1]}; {last})"
    if _is_stale(state, now, tick):
        silent = (
            f" (no heartbeat for {now - state['beat']:.0f} s: frozen, or the machine is overloaded)"
        )
        short, detail = short + silent, detail + silent
    return short, detail


def _grouped(
    states: list[dict[str, Any] | None], now: float, tick: float, first: set[int]
) -> tuple[str, str]:
    """Headline and detail lines, ranks with the same state grouped; the `first` ranks lead."""
    groups: dict[tuple[str, str], list[int]] = {}
    for rank, state in enumerate(states):
        groups.setdefault(_what(state, now, tick), []).append(rank)
    ordered = sorted(groups.items(), key=lambda item: (not (set(item[1]) & first), item[1][0]))
    headline, details = [], []
    for (short, detail), ranks in ordered:
        who = rank_list(ranks)
        verb = "wait" if len(ranks) > 1 else "waits"
        detail = detail.replace(_WAITED, _waited([states[r] for r in ranks], now))
        headline.append(f"{who} {verb} {short}" if short.startswith("in ") else f"{who} {short}")
        details.append(
            f"  {who} {verb} {detail}" if detail.startswith("in ") else f"  {who} {detail}"
        )
    return "; ".join(headline), "\n".join(details)


def _waited(states: list[dict[str, Any] | None], now: float) -> str:
    """How long ranks in one collective have waited: '2.1', or '2.1-2.3' when they differ."""
    waits = [now - s["since"] for s in states if s and "since" in s]
    if not waits:
        return "?"
    low, high = f"{min(waits):.1f}", f"{max(waits):.1f}"
    return low if low == high else f"{low}-{high}"


def _verdict(kind: str, title: str, advice: str, states, now, tick, culprits) -> Verdict:
    headline, details = _grouped(states, now, tick, set(culprits))
    report = f"Cadence stopped the job: {title}\n{details}\n{advice}"
    return Verdict(kind, headline, report, sorted(culprits))


def judge(
    my_rank: int, states: list[dict[str, Any] | None], now: float, settings: WatchSettings
) -> Verdict | None:
    """The verdict of the rank `my_rank` (whose own state must be fresh), or None while all may be well."""
    me = states[my_rank]
    if me is None or me.get("phase") != "collective":
        return None
    tick = settings.tick
    waited = now - me["since"]
    if waited < settings.grace:
        return None
    seq, op = me["seq"], me["op"]
    call = f"{op} #{seq}"
    others = [(rank, s) for rank, s in enumerate(states) if rank != my_rank]
    same_call = [
        (r, s) for r, s in others if s and s.get("phase") == "collective" and s["seq"] == seq
    ]

    different_op = [r for r, s in same_call if s["op"] != op]
    different_shapes = [
        r for r, s in same_call
        if s["op"] == op and op in SAME_SHAPES and s.get("shapes") and me.get("shapes")
        and "<changing>" not in (s["shapes"], me["shapes"]) and s["shapes"] != me["shapes"]
    ]  # fmt: skip
    if different_op or different_shapes:
        what = "different collectives" if different_op else f"{op} with different shapes or dtypes"
        return _verdict(
            "mismatch",
            f"the ranks called {what} as call #{seq}; it can never complete.",
            "Every rank must call the same collectives in the same order, with inputs of the same "
            "shapes and dtypes (see pad_across_processes).",
            states, now, tick, [my_rank, *different_op, *different_shapes],
        )  # fmt: skip

    # A rank that ended before finishing this call will never join it (one that finished it may still
    # be sending its last bytes: that is judged below, as a rank that went ahead).
    ended = [
        r
        for r, s in others
        if s and s.get("phase") in ("exited", "failed") and s.get("done", 0) < seq
    ]
    if ended:
        return _verdict(
            "ended",
            f"{rank_list(ended)} ended while other ranks wait in {call}.",
            "Every rank must reach the same collectives; a rank that returns early or exits leaves "
            "the others waiting.",
            states, now, tick, ended,
        )  # fmt: skip

    deadline = settings.deadline(op, me.get("timeout"))
    ahead = [
        r for r, s in others
        if s and not _is_stale(s, now, tick) and (
            (s.get("phase") == "collective" and s["seq"] != seq)
            or (s.get("phase") in ("running", "exited") and s.get("done", 0) >= seq)
        )
    ]  # fmt: skip
    if ahead and waited >= settings.out_of_step_after(deadline):
        return _verdict(
            "out_of_step",
            f"the ranks are out of step: some wait in {call}, which others have already passed.",
            "Every rank must make the same Cadence collective calls in the same order; some ranks "
            "skipped a call (a collective inside an `if` on the rank?) or made an extra one.",
            states, now, tick, ahead,
        )  # fmt: skip

    if deadline is None or waited < deadline:
        return None
    lagging = [
        r for r, s in others
        if s is None or _is_stale(s, now, tick) or s.get("phase") != "collective" or s["seq"] != seq
    ]  # fmt: skip
    if not lagging:
        return _verdict(
            "backend",
            f"every rank has waited in {call} for {waited:.0f} s; the communication backend makes "
            "no progress.",
            "Check the network between the machines and the health of the GPUs; raise the stuck "
            f"timeout if this collective is legitimately slow ({HOW_TO_CHANGE}).",
            states, now, tick, [],
        )  # fmt: skip
    if me.get("timeout") is not None:
        limit = f"its timeout of {me['timeout']:g} s"
    elif deadline == settings.stuck_timeout:
        limit = f"the stuck timeout of {deadline:g} s"
    else:
        limit = f"the process-group timeout of {deadline:g} s"
    return _verdict(
        "stuck",
        f"{rank_list(lagging)} did not join {call} within {limit}.",
        f"If {rank_list(lagging)} {'is' if len(lagging) == 1 else 'are'} legitimately busy (saving a "
        f"checkpoint, evaluating on one rank), raise the stuck timeout: {HOW_TO_CHANGE}.",
        states, now, tick, lagging,
    )  # fmt: skip


def stall_report(
    my_rank: int, states: list[dict[str, Any] | None], now: float, settings: WatchSettings
) -> str | None:
    """The report (not a stop) of a rank that has waited in a collective for `settings.stall_report`
    seconds, saying where every rank is; None while it has not waited that long."""
    me = states[my_rank]
    if settings.stall_report is None or me is None or me.get("phase") != "collective":
        return None
    waited = now - me["since"]
    if waited < settings.stall_report:
        return None
    seq, op = me["seq"], me["op"]
    tick = settings.tick
    lagging = [
        r for r, s in enumerate(states)
        if r != my_rank and (s is None or s.get("phase") != "collective" or s["seq"] != seq)
    ]  # fmt: skip
    # Grouped by what each rank does (not by how long it has waited), the ranks that hold the job up first.
    groups: dict[str, list[int]] = {}
    for rank, state in enumerate(states):
        groups.setdefault(_what(state, now, tick)[0], []).append(rank)
    ordered = sorted(groups.items(), key=lambda item: (not set(item[1]) & set(lagging), item[1][0]))
    details = "\n".join(
        f"  {rank_list(ranks)} {'wait' if len(ranks) > 1 else 'waits'} {short}"
        if short.startswith("in ")
        else f"  {rank_list(ranks)} {short}"
        for short, ranks in ordered
    )
    deadline = settings.deadline(op, me.get("timeout"))
    if deadline is None:
        then = "the stuck-rank stop is off, so the job waits as long as the backend lets it"
    else:
        then = f"every rank stops at {deadline:g} s of waiting if nothing changes"
    if lagging:
        who = rank_list(lagging)
        title = f"{op} #{seq} has waited {waited:.0f} s for {who}"
        advice = (
            f"This is only a report: the job goes on, and {then}. If {who} "
            f"{'is' if len(lagging) == 1 else 'are'} legitimately busy (saving a checkpoint, "
            "evaluating on one rank) nothing is wrong."
        )
    else:
        title = f"every rank has waited {waited:.0f} s in {op} #{seq}"
        advice = f"This is only a report: the job goes on, and {then}."
    return f"Cadence: no progress: {title}. Where each rank is:\n{details}\n{advice}"
