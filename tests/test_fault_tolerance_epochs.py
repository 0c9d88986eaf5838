"""Fault tolerance for the scripts people write (issue 43): a group killed in any epoch comes back
in step with the job's loops; the DataLoaders users build work unchanged. Each case is a real
`cadence launch --fault_tolerance` run of tests/ft_scripts/ft_campaign_train.py, checked on the
campaign's invariants (tests/ft_campaign.py: every sample of every epoch once over the committed
steps, every rank's weights equal to a one-process replay of them, every evaluation that of the
replay's weights, every launcher exits 0, nothing left behind)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import torch
from ft_campaign import check, run

# The cases of the table: 256 samples, batches of 4, `for epoch in range(2): for batch in
# loader`, one group SIGKILLed while the job runs (train #N: before its Nth batch).
BASE: dict[str, Any] = {
    "seed": None,
    "nproc": 1,
    "accum": 1,
    "epochs": 2,
    "samples": 256,
    "batch": 4,
    "eval_samples": 22,
    "idiom": "epochs",
    "quorum_every": 16,
    "end_training": False,
    "slow": 0.3,
    "save_every": 5,
    "schedule": 2 * 256 // 4,
    "total": 0,
}


def _kill(group: int, at: int, incarnation: int = 0) -> dict[str, Any]:
    return {
        "group": group,
        "incarnation": incarnation,
        "phase": "train",
        "at": at,
        "signal": "KILL",
    }


CASES = {
    # shuffle=True without a generator, after set_seed(0), as every Accelerate example builds it:
    # refused before; the job agrees on the first quorum's order. (The table's second case, the same
    # kill with a generator, was right before; the other cases use one.)
    "shuffle_without_generator": {"groups": 2, "loader": "shuffle", "kills": [_kill(1, 10)]},
    # 32 steps an epoch: the restarted group's script began at its epoch 0, trained the job's
    # epoch 1 from the cursor, then an epoch 2 alone (samples twice, weights apart).
    "kill_in_epoch_1": {"groups": 2, "loader": "shuffle_gen", "kills": [_kill(1, 40)]},
    "three_groups_kill_in_epoch_1": {
        "groups": 3,
        "loader": "shuffle_gen",
        "kills": [_kill(2, 25)],
    },
    "three_groups_accumulation_clip_two_kills": {
        "groups": 3,
        "loader": "shuffle",
        "accum": 2,
        "clip": 0.5,
        "kills": [_kill(1, 12), _kill(2, 30)],
    },
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_group_killed_in_any_epoch_ends_in_step_with_the_job(name: str, tmp_path: Path) -> None:
    pytest.importorskip("torchft")
    scenario = {**BASE, **CASES[name], "seed": name}
    out = tmp_path / "run"
    result = run(scenario, out, timeout=300)
    check(scenario, out, result)
    assert any(out.glob("killed.*")), "the failure fired"
    text = result.stdout + result.stderr
    assert "healed from group" in text


def test_a_group_whose_counter_lags_stops_when_the_others_scripts_end(tmp_path: Path) -> None:
    """transformers' idiom with max_train_steps below the epoch's steps: the restarted group's
    `completed_steps` starts again at 0, so its script would go on after the others break. They
    tell it when their scripts end: it trains no step past the job's last, and reports them as
    finished, not lost."""
    pytest.importorskip("torchft")
    scenario = {
        **BASE,
        "seed": "max_steps",
        "groups": 2,
        "loader": "shuffle_gen",
        "samples": 96,
        "batch": 2,
        "schedule": 96,
        "idiom": "no_trainer",
        "max_steps": 18,
        "kills": [_kill(1, 4)],
    }
    out = tmp_path / "run"
    result = run(scenario, out, timeout=300)
    check(scenario, out, result)  # exactly max_steps committed steps, weights as the replay's
    text = result.stdout + result.stderr
    assert re.search(r"replica group 0 finished its script at step \d+", text), text[-4000:]
    assert "replica group 0 lost" not in text


@pytest.mark.parametrize(
    ("make", "says"),
    [
        (
            lambda t, d: t.utils.data.DataLoader(_Stream(), batch_size=2),
            "an IterableDataset (_Stream) has none",
        ),
        (
            lambda t, d: t.utils.data.DataLoader(d, batch_sampler=_Varying(d)),
            "a _Varying as batch_sampler may vary them",
        ),
        (
            lambda t, d: t.utils.data.DataLoader(
                d, batch_size=2, sampler=t.utils.data.WeightedRandomSampler([1.0] * 8, 8)
            ),
            "a DataLoader with a WeightedRandomSampler cannot be re-cut exactly",
        ),
        (
            lambda t, d: t.utils.data.DataLoader(
                d, batch_size=2, sampler=t.utils.data.RandomSampler(d, replacement=True)
            ),
            "a RandomSampler with replacement=True or num_samples=... cannot be re-cut",
        ),
    ],
)
def test_loaders_the_cursor_cannot_cut_exactly_are_refused_saying_what_works(make, says) -> None:
    from cadence.fault_tolerance.loader_source import read_source

    with pytest.raises(ValueError, match="fault tolerance") as refused:
        read_source(make(torch, torch.arange(8)))
    assert says in str(refused.value)
    assert "docs: Training through failures" in str(refused.value)


def test_the_loaders_users_build_are_read_as_they_mean() -> None:
    from cadence.fault_tolerance.loader_source import read_source

    data = torch.arange(10)
    sampler = torch.utils.data.RandomSampler(data)
    seen = {
        "shuffle": read_source(torch.utils.data.DataLoader(data, batch_size=4, shuffle=True)),
        "drop_last": read_source(torch.utils.data.DataLoader(data, batch_size=4, drop_last=True)),
        "batch_sampler": read_source(
            torch.utils.data.DataLoader(
                data, batch_sampler=torch.utils.data.BatchSampler(sampler, 3, drop_last=True)
            )
        ),
    }
    assert (seen["shuffle"].shuffle, seen["shuffle"].own_generator) == (True, True)
    assert (seen["drop_last"].shuffle, seen["drop_last"].drop_last) == (False, True)
    assert (seen["batch_sampler"].batch_size, seen["batch_sampler"].drop_last) == (3, True)
    assert seen["batch_sampler"].shuffle and seen["batch_sampler"].own_generator


class _Stream(torch.utils.data.IterableDataset):
    def __iter__(self):
        return iter(range(8))


class _Varying:
    def __init__(self, data) -> None:
        self.data = data

    def __iter__(self):
        yield [0]
        yield [1, 2, 3]

    def __len__(self) -> int:
        return 2


def test_every_group_lost_at_once_after_training_is_refused_not_trained_again(
    tmp_path: Path,
) -> None:
    """Both groups SIGKILLed at the same step: nobody holds the trained state. The restarted
    groups would meet at the job's first step with nobody ahead to heal from; instead of training
    every sample again they stop, saying to resume from a checkpoint (the launcher exits with an
    error), and no sample was committed twice."""
    pytest.importorskip("torchft")
    scenario = {
        **BASE,
        "seed": "all_lost",
        "groups": 2,
        "loader": "shuffle_gen",
        "samples": 96,
        "batch": 2,
        "schedule": 96,
        "kills": [_kill(0, 6), _kill(1, 6)],
        "max_restarts": 1,  # each restart is refused the same way
    }
    out = tmp_path / "run"
    result = run(scenario, out, timeout=300)
    text = result.stdout + result.stderr
    assert result.returncode != 0, text[-3000:]
    assert "no group that holds them is left (every replica group was lost at once)" in text
    assert "Restart the job from its last checkpoint" in text
    committed = [
        i
        for g in (0, 1)
        for line in (out / f"ledger.{g}.0.jsonl").read_text().splitlines()
        if json.loads(line)["committed"]
        for mb in json.loads(line)["mbs"]
        for i in mb
    ]
    assert committed and len(committed) == len(set(committed))


def test_a_restarted_scripts_loops_pass_through_what_the_job_finished() -> None:
    """The loader alone (no process group): the job's loader is two passes in (its first epoch
    done, the second at its 4th sample); a restarted script's loader, given the job's pass record,
    yields nothing in its first pass and continues the second at the job's cursor; a script that
    started more passes than the job is refused before anything changes."""
    from cadence.fault_tolerance.loader import CursorLoader, StepView

    def loader() -> CursorLoader:
        data = torch.utils.data.DataLoader(list(range(8)), batch_size=2)
        return CursorLoader(data, None, lambda: StepView(1, 0))

    job = loader()
    for _ in job:  # epoch 0, every step committed
        job.end_step(True)
    running = iter(job)  # epoch 1: two steps committed
    for _ in range(2):
        next(running)
        job.end_step(True)
    record, position = job.pass_record(), job.state_dict()
    assert (record["passes"], record["iterating"], record["trains"]) == (2, True, True)

    restarted = loader()
    restarted.check_passes(record, group=1)
    restarted.load_state_dict(position)
    restarted.line_up(record)
    assert restarted.behind()
    assert list(restarted) == []  # the epoch the job finished: nothing drawn
    assert [b.tolist() for b in restarted] == [[4, 5], [6, 7]]  # the job's epoch at its cursor
    assert not restarted.behind()

    ahead = loader()
    for _ in range(3):
        list(ahead)
    with pytest.raises(RuntimeError, match="has started 3 passes over a prepared DataLoader"):
        ahead.check_passes(record, group=1)
