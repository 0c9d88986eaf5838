"""The healthy steps of fault tolerance (issue 36): a step after a committed step with every group
in it is cut on that step's quorum, which it reuses without asking the Lighthouse, or, every
`quorum_every` steps, while its own forms beside the forward pass; the step's all-reduce carries
each group's cut and step, and any difference discards the step on every group.

The rule that decides it is walked over every way up to three groups can cut a step, against the
samples each group trains; a real three-group run checks which healthy steps reuse and which
overlap, and that gather_for_metrics on either returns the step's global batch."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest
import torch
from test_fault_tolerance import _launch, _rank_ledgers, _script

from cadence.fault_tolerance.step_share import (
    BLOCKS,
    contributors,
    membership_reports,
    one_cut,
    share_row,
)

BATCH = 2  # samples per participant in the walk below


STEPS = (65535, 65536)  # a step and the next (a group that discarded one the others committed)


def _exact(cuts: dict[int, tuple[int, int, int, int]]) -> bool:
    """From first principles: the contributors' samples are one step's `k x BATCH` samples, each
    once (rank r of a cut at step s trains that step's samples r*BATCH .. r*BATCH+BATCH-1), every
    group cut for `k` participants (the epoch's tail is shared out by that count) and averages
    over `k`."""
    k = len(cuts)
    if not k:
        return False
    trained = sorted(
        (step, sample)
        for _, rank, _, step in cuts.values()
        for sample in range(rank * BATCH, rank * BATCH + BATCH)
    )
    one_step = [(trained[0][0], sample) for sample in range(k * BATCH)]
    return trained == one_step and all(
        cut == k and counted == k for cut, _, counted, _ in cuts.values()
    )


@pytest.mark.parametrize("groups", [1, 2, 3])
def test_one_cut_agrees_with_the_samples_trained_for_every_way_groups_cut_a_step(
    groups: int,
) -> None:
    """Every subset of contributing groups, each with every (participants cut for, rank, count
    torchft averages over) in 1..G x 0..G-1 x 1..G at one step, and each cut that trains one
    step's samples again with its groups at every choice of two consecutive steps: one_cut is True
    exactly when the contributors train one step's samples once and every group averages over
    them."""
    values = list(itertools.product(range(1, groups + 1), range(groups), range(1, groups + 1)))
    walked = agreed = 0
    for size in range(groups + 1):
        for members in itertools.combinations(range(groups), size):
            for choice in itertools.product(values, repeat=size):
                at_one_step = dict(zip(members, (cut + (STEPS[0],) for cut in choice)))
                walks = [at_one_step]
                if _exact(at_one_step):  # the same cut, its groups at every mix of two steps
                    walks = [
                        {g: cut[:3] + (step,) for (g, cut), step in zip(at_one_step.items(), steps)}
                        for steps in itertools.product(STEPS, repeat=size)
                    ]
                for cuts in walks:
                    summed = torch.zeros(BLOCKS * groups)
                    for g, cut in cuts.items():
                        summed += share_row(groups, g, *cut)
                    assert contributors(summed, groups) == list(members)
                    assert one_cut(summed, groups) == _exact(cuts), cuts
                    walked += 1
                    agreed += _exact(cuts)
    assert agreed >= 1 and walked > agreed  # both answers occur in the walk


def test_three_groups_reuse_or_overlap_quorums_and_gather_on_both(tmp_path: Path) -> None:
    """3 replica groups x 1 process, healthy, `--quorum_every 3`: no step discarded, every sample
    once, the same weights. Step 0 waits for its quorum; a step whose index is not a multiple of 3
    reuses the last quorum; steps 3 and 6 ask for a new one, formed beside the step (3, before any
    gather) or waited for (6: gather_for_metrics started at step 3, which checked the quorum
    before gathering). Each gather (tensors and objects), on reused and quorum-forming steps alike,
    is the step's global batch in the groups' order, the same on all three; the tail (one sample a
    group) too. `--max_restarts 0` with one process a group still runs each group under torch
    elastic's agent (its Manager needs the group's store; it used to hang)."""
    pytest.importorskip("torchft")
    samples, first_gather, every = 45, 3, 3  # 6 a step: 7 whole steps, then the tail of 3
    result = _launch(
        tmp_path, "--fault_tolerance", "--replica_groups", "3", "--max_restarts", "0",
        "--quorum_every", str(every),
        FT_SAMPLES=str(samples), FT_BATCH=str(BATCH), FT_GATHER="1",
        FT_GATHER_FROM=str(first_gather),
    )  # fmt: skip
    text = result.stdout + result.stderr
    assert result.returncode == 0, text[-6000:]
    ledgers = _rank_ledgers(tmp_path, 3, 1)
    rows = [ledgers[(g, 0)] for g in range(3)]
    assert all(r["committed"] for group in rows for r in group), text[-3000:]
    assert sorted(i for group in rows for r in group for i in r["ids"]) == list(range(samples))
    weights = [json.loads((tmp_path / f"weights.{g}.0.json").read_text()) for g in range(3)]
    assert weights[0]["weights"] == weights[1]["weights"] == weights[2]["weights"]
    reused = overlapped = 0
    for step in range(len(rows[0])):  # every step committed with all three: the rule alone
        if step % every:
            reused += 1
        elif 0 < step <= first_gather:  # asked for beside the step: no gather before it
            overlapped += 1
        for group in rows:
            assert (group[step]["reused"], group[step]["overlapped"]) == (reused, overlapped), step
    assert reused and overlapped and len(rows[0]) - reused - overlapped >= 2  # all three kinds
    data = _script().Indexed(samples)
    for step in range(first_gather, len(rows[0])):
        records = [group[step] for group in rows]
        assert all(r["gathered"] == records[0]["gathered"] for r in records), step
        gathered = records[0]["gathered"]
        assert gathered["ids"] == [i for r in records for i in r["ids"]]  # groups 0, 1, 2
        assert gathered["objects"] == gathered["ids"]
        assert torch.equal(torch.tensor(gathered["x"]), data.x[torch.tensor(gathered["ids"])])
    assert [len(group[-1]["ids"]) for group in rows] == [1, 1, 1]  # the tail, shared out
    refused = (tmp_path / "gather_refused.0").read_text()
    assert "Call gather_for_metrics before optimizer.step()" in refused


def _early_and_late(tmp_path: Path, **knobs: str) -> dict[int, dict]:
    """Two healthy runs of 2 groups x 1 process on the width-512 MLP (its 512 x 512 gradient, 1 MiB,
    may start its average during the backward pass on steps that reuse the quorum): with
    `--quorum_every 3` (steps reused, overlapped and waited for) and 1 (every step asks for a
    quorum: every average at the optimizer step). Each: both groups end with the same weights, and
    every sample is committed once. Returns, per setting, the weights, each group's ledger and the
    output."""
    runs = {}
    for every in (3, 1):
        out = tmp_path / f"every{every}"
        result = _launch(
            out, "--fault_tolerance", "--replica_groups", "2", "--quorum_every", str(every),
            FT_MLP="512", **knobs,
        )  # fmt: skip
        text = result.stdout + result.stderr
        assert result.returncode == 0, text[-4000:]
        rows = [_rank_ledgers(out, 2, 1)[(g, 0)] for g in (0, 1)]
        committed = sorted(i for group in rows for r in group if r["committed"] for i in r["ids"])
        assert committed == list(range(int(knobs["FT_SAMPLES"])))
        weights = [json.loads((out / f"weights.{g}.0.json").read_text())["weights"] for g in (0, 1)]
        assert weights[0] == weights[1]
        runs[every] = {"weights": weights[0], "rows": rows, "text": text}
    return runs


def test_averages_started_during_backward_train_what_averages_at_the_step_train(
    tmp_path: Path,
) -> None:
    """2 micro-batches a step, the norm clipped: with averages started during the backward pass
    the final weights are bit for bit those of averages at the optimizer step (`_early_and_late`),
    no step discarded; the first run started averages early, the second never."""
    pytest.importorskip("torchft")
    runs = _early_and_late(tmp_path, FT_SAMPLES="48", FT_BATCH="2", FT_ACCUM="2", FT_CLIP="0.5")
    assert runs[3]["weights"] == runs[1]["weights"]  # the same training, bit for bit
    for every, early in ((3, lambda n: n >= 2), (1, lambda n: n == 0)):
        rows = runs[every]["rows"]
        assert all(r["committed"] for group in rows for r in group)
        assert all(early(group[-1]["early"]) for group in rows), every


def test_two_backward_passes_in_a_step_turn_the_early_start_off_after_one_discard(
    tmp_path: Path,
) -> None:
    """Two backward passes in one step (two half losses) add to the 1 MiB gradient after its
    average started: that step is discarded on both groups, said once by each, and from then on
    averages wait for the optimizer step; the training is bit for bit that of `--quorum_every 1`
    (no early start at all), its samples each once."""
    pytest.importorskip("torchft")
    runs = _early_and_late(tmp_path, FT_SAMPLES="32", FT_BATCH="4", FT_TWO_BACKWARDS="1")
    assert runs[3]["weights"] == runs[1]["weights"]
    said = "was accumulated again after its average"
    for every, discards in ((3, 1), (1, 0)):
        rows, text = runs[every]["rows"], runs[every]["text"]
        assert [sum(not r["committed"] for r in group) for group in rows] == [discards] * 2
        assert text.count(said) == 2 * discards  # once by each group


def test_every_membership_change_is_reported_once_by_a_group_that_saw_it() -> None:
    """Every pair (quorum before, quorum after) of three groups, each group seeing the change or
    having just returned (no quorum of its own before): each lost and each joined group is said
    exactly once over all groups, by a group in both quorums; nothing is said without a change."""
    groups = range(3)
    subsets = [frozenset(c) for size in range(1, 4) for c in itertools.combinations(groups, size)]
    for before in subsets:
        for after in subsets:
            lines = [
                line
                for g in after
                for line in membership_reports(before if g in before else None, after, g, 3, 7)
            ]
            expected = [f"replica group {g} lost at step 7" for g in sorted(before - after)]
            expected += [f"replica group {g} joined at step 7" for g in sorted(after - before)]
            if not before & after:
                expected = []  # nobody saw both quorums: nobody can tell
            said = sorted(line.split(";")[0] for line in lines)
            assert said == sorted(expected), (before, after, lines)
            assert all(line.endswith(f"{len(after)} of 3 groups training") for line in lines)
