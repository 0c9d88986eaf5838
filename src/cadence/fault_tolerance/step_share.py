"""What each replica group says of a step in the step's own gradient all-reduce, and what the sum
of those rows tells every group: who contributed, and whether they all cut the batch from one
quorum at one step (see session.py: a step may be drawn on the previous step's quorum, or reuse
it without asking the Lighthouse).

A row has seven blocks of `groups` slots; group g writes only its slot of each: 1 (it contributed),
the participant count its batch was cut with, its participating rank in that cut, the participant
count torchft averages and votes with, its step (the Manager's count of committed steps, modulo
`STEP_MODULUS`: groups a step or a few apart must differ, and the row survives the average's
division and multiplication in float32 exactly enough to round back), and 1 when its script has
ended (a `finished_row`: then it contributes nothing else, and every group discards the step), and
1 when its processes were restarted (their scripts began again at the first line, so counters the
script keeps itself may lag the job's: another group writes the checkpoints, `checkpoint_writer`). A
group torchft does not count as a participant (one healing beside an overlapped quorum) sends
zeros: it contributes nothing.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

BLOCKS = 7
STEP_MODULUS = 1 << 16


def share_row(
    groups: int,
    group: int,
    cut_with: int,
    rank: int,
    counted: int,
    step: int = 0,
    restarted: bool = False,
) -> torch.Tensor:
    """Group `group`'s row at `step`: its batch cut as `rank` of `cut_with` participants;
    torchft counts `counted` participants; `restarted`: its processes began again."""
    values = [0.0] * (BLOCKS * groups)
    row = (1, cut_with, rank, counted, step % STEP_MODULUS, 0, int(restarted))
    for block, value in enumerate(row):
        values[block * groups + group] = float(value)
    return torch.tensor(values, dtype=torch.float32)


def finished_row(groups: int, group: int) -> torch.Tensor:
    """Group `group`'s row once its script has ended: it says so, and contributes nothing."""
    values = [0.0] * (BLOCKS * groups)
    values[5 * groups + group] = 1.0
    return torch.tensor(values, dtype=torch.float32)


def finished(summed: torch.Tensor | Sequence[float], groups: int) -> list[int]:
    """The groups whose scripts have ended, by their rows in `summed`."""
    counts = _counts(summed[5 * groups : 6 * groups])
    return [g for g in range(groups) if counts[g] >= 1]


def checkpoint_writer(summed: torch.Tensor | Sequence[float], groups: int) -> int | None:
    """The group that writes `save_state`: the first contributor whose processes never restarted
    (its script's own counters, which may name a checkpoint, are the job's), else the first
    contributor; None when no group contributed."""
    members = contributors(summed, groups)
    restarted = _counts(summed[6 * groups : 7 * groups])
    steady = [g for g in members if restarted[g] == 0]
    return (steady or members or [None])[0]


def _counts(summed: torch.Tensor | Sequence[float]) -> list[int]:
    values = summed.tolist() if isinstance(summed, torch.Tensor) else summed
    return [round(value) for value in values]


def contributors(summed: torch.Tensor | Sequence[float], groups: int) -> list[int]:
    """The groups whose rows are in `summed` (the rows' sum, a tensor or its values)."""
    counts = _counts(summed[:groups])
    return [g for g in range(groups) if counts[g] >= 1]


def one_cut(summed: torch.Tensor | Sequence[float], groups: int) -> bool:
    """Whether the contributing groups cut one step's batch from one quorum: all at the same step,
    each cut it for, and torchft counts, as many participants as contributed, and their ranks are
    0 .. n-1 once each. Then their slices are the step's `n x batch` samples, each once, and every
    group averages over the same count; otherwise the step must be discarded by every group (a
    group that discarded a step the others committed redraws that step's samples: the steps
    differ).

    Example: two groups, both cut as 2 participants, ranks 0 and 1, counted 2: one cut.

        >>> rows = share_row(2, 0, 2, 0, 2) + share_row(2, 1, 2, 1, 2)
        >>> one_cut(rows, 2)
        True
        >>> one_cut(share_row(2, 0, 2, 0, 2) + share_row(2, 1, 1, 0, 1), 2)
        False
    """
    counts = _counts(summed)
    if any(counts[g] > 1 for g in range(groups)):
        return False  # a group counted twice: never happens with distinct indices; never commit
    members = contributors(counts, groups)
    assumed = {counts[block * groups + g] for g in members for block in (1, 3)}
    ranks = sorted(counts[2 * groups + g] for g in members)
    steps = {counts[4 * groups + g] for g in members}
    return assumed == {len(members)} and ranks == list(range(len(members))) and len(steps) == 1


def membership_reports(
    before: frozenset[int] | None, members: frozenset[int], group: int, total: int | None, step: int
) -> list[str]:
    """The lines group `group` says when a committed step's contributors are `members` and the
    last ones it saw were `before` (None: it has seen none, e.g. it just returned).

    One group reports each change: the first that was in both (a returning group has nothing of
    its own to compare with, so it never reports its own return; one that stayed does).
    """
    if before is None or before == members:
        return []
    continuing = before & members
    if not continuing or min(continuing) != group:
        return []
    lines = [
        f"replica group {lost} lost at step {step}; {len(members)} of {total} groups training"
        for lost in sorted(before - members)
    ]
    lines += [
        f"replica group {joined} joined at step {step}; {len(members)} of {total} groups training"
        for joined in sorted(members - before)
    ]
    return lines
