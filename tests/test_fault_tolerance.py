"""Per-step fault tolerance on torchft (issue 36): real `cadence launch --fault_tolerance` runs on
loopback, each bounded by a subprocess timeout; assertions on counts, steps and weights only."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).parent / "ft_scripts" / "ft_train.py"
SRC = Path(__file__).resolve().parents[1] / "src"


def _env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(SRC), env.get("PYTHONPATH", "")])
    env.update(extra)
    return env


def _launch(
    out: Path, *flags: str, timeout: int = 240, **knobs: str
) -> subprocess.CompletedProcess:
    out.mkdir(parents=True, exist_ok=True)
    argv = [sys.executable, "-m", "cadence.commands.cli", "launch", "--cpu", *flags, str(SCRIPT)]
    try:
        return subprocess.run(
            argv,
            env=_env(FT_OUT=str(out), **knobs),
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    except subprocess.TimeoutExpired as late:  # the output says where it stuck
        text = [
            t.decode() if isinstance(t, bytes) else (t or "") for t in (late.stdout, late.stderr)
        ]
        return subprocess.CompletedProcess(
            argv, -9, text[0], text[1] + f"\n[timed out: {timeout} s]"
        )


def _lines(out: Path, group: int) -> list[dict]:
    path = out / f"ledger.{group}.0.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _ledger(out: Path, group: int) -> list[dict]:
    """The step records of `group` (the save markers left out)."""
    return [r for r in _lines(out, group) if "committed" in r]


def _weights(out: Path, group: int) -> list[float]:
    return json.loads((out / f"weights.{group}.0.json").read_text())["weights"]


def _committed_ids(out: Path, groups: int) -> list[int]:
    return sorted(
        i for g in range(groups) for r in _ledger(out, g) if r["committed"] for i in r["ids"]
    )


def _check_run(
    result: subprocess.CompletedProcess, out: Path, samples: int, extra: tuple[int, ...] = ()
) -> None:
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    # Every sample of the epoch trained exactly once, across the kill and the heal.
    assert sorted(_committed_ids(out, 2) + list(extra)) == list(range(samples))
    # The survivor never restarted; the killed group came back as a second incarnation.
    assert {r["incarnation"] for r in _ledger(out, 0)} == {0}
    assert {r["incarnation"] for r in _ledger(out, 1)} == {0, 1}
    # After the heal both groups hold the same weights.
    assert _weights(out, 0) == _weights(out, 1)


SAMPLES = 96
CLIP = 0.1  # the killed run clips the gradient norm to this (below most steps' norms)


@pytest.fixture(scope="module")
def killed_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """One run shared by several tests: two groups, group 1 SIGKILLed between steps 4 and 5 and
    restarted by its agent; the survivor saves a checkpoint at its first step trained alone."""
    pytest.importorskip("torchft")
    out = tmp_path_factory.mktemp("killed")
    result = _launch(
        out, "--fault_tolerance", "--replica_groups", "2", "--nproc_per_node", "1",
        FT_SAMPLES=str(SAMPLES), FT_KILL_GROUP="1", FT_KILL_AT="4", FT_SLOW_ALONE="1.0",
        FT_SAVE_DEGRADED="1", FT_CLIP=str(CLIP),
    )  # fmt: skip
    _check_run(result, out, SAMPLES)
    return out, result.stdout + result.stderr


def test_group_killed_between_steps_survivor_continues_and_heal_matches(
    killed_run: tuple[Path, str],
) -> None:
    tmp_path, text = killed_run
    survivor = _ledger(tmp_path, 0)
    assert sum(not r["committed"] for r in survivor) <= 1  # at most one step discarded
    assert any(r["participants"] == 1 and r["committed"] for r in survivor)  # trained alone
    assert "replica group 1 lost at step" in text and "1 of 2 groups training" in text
    assert "group 1 healed from group 0 at step" in text
    assert text.count("replica group 1 joined at step") == 1 and "2 of 2 groups training" in text
    # The scheduler followed committed steps only: the same learning rate on both at the end.
    assert survivor[-1]["lr"] == _ledger(tmp_path, 1)[-1]["lr"]


def test_a_script_with_its_own_batches_opens_the_step_at_the_forward_pass_and_heals_before_it(
    tmp_path: Path,
) -> None:
    """A script that iterates its own batches (no prepared DataLoader): the prepared model's first
    forward pass opens each step, so the job's first step commits (torchft syncs group 1's weights
    from group 0 at step 0, before the forward pass), and a group killed and restarted heals before
    its forward pass: its first step commits, with no wait on either side. (The step used to open
    at the optimizer step, after the gradients: every heal discarded the step, at step 0 forever.)
    Both end at the job's last step with the same weights."""
    pytest.importorskip("torchft")
    result = _launch(
        tmp_path, "--fault_tolerance", "--replica_groups", "2",
        FT_UNPREPARED="1", FT_SAMPLES="64", FT_BATCH="2", FT_KILL_GROUP="1", FT_KILL_AT="3",
        FT_SLOW_ALONE="0.5",
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    survivor = _ledger(tmp_path, 0)
    returned = [r for r in _ledger(tmp_path, 1) if r["incarnation"] == 1]
    assert "group 1 healed from group 0 at step" in result.stdout + result.stderr
    assert survivor[0]["committed"] and _ledger(tmp_path, 1)[0]["committed"]  # step 0 commits
    assert returned[0]["committed"]  # healed before its forward pass
    assert sum(not r["committed"] for r in survivor) <= 1  # the step group 1 died in, at most
    assert max(b["t"] - a["t"] for a, b in zip(survivor, survivor[1:])) < 5
    assert {r["incarnation"] for r in survivor} == {0}
    assert sum(r["committed"] for r in survivor) == 32  # the job's 32 steps, each once
    assert survivor[-1]["step"] == returned[-1]["step"]  # one schedule
    assert _weights(tmp_path, 0) == _weights(tmp_path, 1)


def test_an_optimizer_prepared_without_its_model_is_refused_at_the_first_step(
    tmp_path: Path,
) -> None:
    """Without the prepared model a healing group could not receive its weights: the first
    optimizer step stops with an error that says to prepare it (no step trained)."""
    pytest.importorskip("torchft")
    result = _launch(
        tmp_path, "--fault_tolerance", "--replica_groups", "2", "--max_restarts", "0",
        FT_UNPREPARED="model", FT_SAMPLES="8", FT_BATCH="2", timeout=120,
    )  # fmt: skip
    assert result.returncode != 0
    assert "fault tolerance needs the model prepared with the optimizer" in result.stderr
    assert not any(_ledger(tmp_path, g) for g in (0, 1))


def _replay(
    steps: dict[int, list[dict]], data, model, optimizer, clip: float | None = None
) -> list[float]:
    """One process replays committed steps (the scheduler's count after the step -> the records of
    its participating ranks): per step the gradient of each rank's batch, averaged over them (its
    norm clipped to `clip`, when given: the average's, as DDP's clip is), then `optimizer` steps and a StepLR(1, 0.99) on it once per participating rank (as Accelerate's
    prepared scheduler advances once per process: the schedule counts batches as one process
    would); returns the final weights, flattened. No committed step may be missing."""
    import torch

    counts = sorted(steps)
    assert counts == list(itertools.accumulate(len(steps[count]) for count in counts)), counts
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.99)
    for step in counts:
        records = steps[step]
        assert {r["participants"] for r in records} == {len(records)}  # every participant logged
        total = [torch.zeros_like(p) for p in model.parameters()]
        for record in records:
            model.zero_grad()
            ids = torch.tensor(record["ids"])
            torch.nn.functional.mse_loss(model(data.x[ids]), data.y[ids]).backward()
            total = [t + p.grad for t, p in zip(total, model.parameters())]
        for parameter, summed in zip(model.parameters(), total):
            parameter.grad = summed / len(records)
        if clip is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        optimizer.step()
        for _ in records:
            scheduler.step()
    return torch.cat([p.detach().flatten() for p in model.parameters()]).tolist()


def test_final_weights_equal_a_single_process_replay_of_the_committed_steps(
    killed_run: tuple[Path, str],
) -> None:
    """Replay, in this process, each committed step of the ledger: the same samples per
    participant, gradients averaged over the step's participants and their norm clipped (the
    run called clip_grad_norm_ before each step: it clips the average across the groups, not a
    group's own), SGD and the scheduler stepped once; the run's final weights (after a kill, a
    degraded stretch and a heal) are the replay's."""
    import torch

    out, _ = killed_run
    data = _script().Indexed(SAMPLES)
    steps: dict[int, list[dict]] = {}
    for group in (0, 1):
        for record in _ledger(out, group):
            if record["committed"]:
                steps.setdefault(record["step"], []).append(record)
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    replay = torch.tensor(_replay(steps, data, model, optimizer, clip=CLIP))
    final = torch.tensor(_weights(out, 0))
    torch.testing.assert_close(final, replay, rtol=1e-5, atol=1e-6)


def _script():
    """The training script as a module (its dataset)."""
    from harness import load_script

    return load_script(SCRIPT, "ft_train")


def _rank_ledgers(out: Path, groups: int, ranks: int) -> dict[tuple[int, int], list[dict]]:
    """(group, rank) -> that rank's step records."""
    found = {}
    for group in range(groups):
        for rank in range(ranks):
            path = out / f"ledger.{group}.{rank}.jsonl"
            rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
            found[(group, rank)] = [r for r in rows if "committed" in r]
    return found


def two_groups_of_two_killed_and_healed(
    out: Path, samples: int, **knobs: str
) -> tuple[dict[tuple[int, int], list[dict]], str]:
    """2 replica groups x 2 processes, batches of 3, group 1 SIGKILLed before its 4th step and
    restarted by its agent: the launch succeeds, the committed ids are the epoch exactly once, the
    survivor never restarts and group 1 is reported lost, then healed. Returns (group, rank) ->
    records, and the launch's output."""
    # The survivor, sleeping 2 s a step alone, has 14 steps left after the kill: it outlasts the
    # restart of a two-process group on a loaded machine (the run lasts as long as that restart).
    result = _launch(
        out, "--fault_tolerance", "--replica_groups", "2", "--nproc_per_node", "2",
        "--max_restarts", "1",
        FT_SAMPLES=str(samples), FT_BATCH="3", FT_KILL_GROUP="1", FT_KILL_AT="3",
        FT_SLOW_ALONE="2.0", **knobs,
    )  # fmt: skip
    text = result.stdout + result.stderr
    assert result.returncode == 0, text[-6000:]
    ledgers = _rank_ledgers(out, 2, 2)
    committed = sorted(
        i for rows in ledgers.values() for r in rows if r["committed"] for i in r["ids"]
    )
    assert committed == list(range(samples))  # the epoch exactly once, across kill and heal
    assert {r["incarnation"] for k in (0, 1) for r in ledgers[(0, k)]} == {0}
    assert {r["incarnation"] for k in (0, 1) for r in ledgers[(1, k)]} == {0, 1}
    assert "replica group 1 lost at step" in text and "group 1 healed from group 0" in text
    return ledgers, text


def test_two_processes_per_group_kill_heal_and_gather_for_metrics(tmp_path: Path) -> None:
    """2 replica groups x 2 processes (DDP inside a group, the Manager's average across groups):
    group 1 SIGKILLed between steps and restarted by its agent (both its processes), the survivor
    goes on alone and the group heals. Every sample trained exactly once, the four ranks end with
    the same weights. gather_for_metrics in each step returns the step's global batch (the four
    ranks' slices, group by group in participating order), the same on every rank; over the
    committed steps it covers the epoch once; a gather that lost a group raised and its step was
    discarded; after the optimizer stepped it is refused. Batches of 3: 12 samples a step with both
    groups, 6 alone, so the epoch ends in a shorter step (4 samples, one per rank, or 10 shared
    3/3/2/2, as the number of steps trained alone is even or odd) that every rank gathers whole.
    Gathering starts at the second step, which is drawn on the first step's quorum when that one
    committed: the gather checks the cut first; from then on every step waits for its quorum."""
    pytest.importorskip("torchft")
    import torch

    samples = 124
    ledgers, text = two_groups_of_two_killed_and_healed(
        tmp_path, samples, FT_GATHER="1", FT_GATHER_FROM="1"
    )
    weights = [json.loads((tmp_path / f"weights.{g}.{k}.json").read_text())["weights"]
               for g in (0, 1) for k in (0, 1)]  # fmt: skip
    assert all(w == weights[0] for w in weights)
    # gather_for_metrics: per committed step, every rank's result is the step's global batch.
    steps: dict[int, dict[tuple[int, int], dict]] = {}
    for key, rows in ledgers.items():
        for record in rows:
            if record["committed"]:
                steps.setdefault(record["step"], {})[key] = record
    data = _script().Indexed(samples)
    first = min(steps)
    if all("gathered" not in r for r in steps[first].values()):  # the first step did not gather
        gathered_ids = [i for r in steps.pop(first).values() for i in r["ids"]]
    else:
        gathered_ids = []
    assert all(
        "overlapped" in r and r["overlapped"] <= 1 for rows in ledgers.values() for r in rows
    )
    for step, records in sorted(steps.items()):
        groups = sorted({g for g, _ in records})
        assert len(records) == 2 * len(groups)  # both ranks of each participating group
        orders = [
            [i for g in order for k in (0, 1) for i in records[(g, k)]["ids"]]
            for order in (groups, groups[::-1])
        ]  # the groups' participating order is the quorum's
        results = [r["gathered"] for r in records.values()]
        assert all(result == results[0] for result in results), step  # the same on every rank
        assert results[0]["ids"] in orders and results[0]["objects"] == results[0]["ids"]
        expected = data.x[torch.tensor(results[0]["ids"])]  # the inputs, rows in the same order
        assert torch.equal(torch.tensor(results[0]["x"]), expected)
        gathered_ids += results[0]["ids"]
    assert sorted(gathered_ids) == list(range(samples))  # the epoch once, with the first step
    last = steps[max(steps)]
    assert sum(len(r["ids"]) for r in last.values()) in (4, 10)  # the tail, each sample once
    for rows in ledgers.values():  # a gather that lost a group said so; its step was discarded
        assert all(not r["committed"] for r in rows if "error" in r.get("gathered", {}))
    refused = (tmp_path / "gather_refused.0").read_text()
    assert "of replica group 0: gather_for_metrics over a DataLoader prepared under" in refused
    assert "Call gather_for_metrics before optimizer.step()" in refused


def _saved_step(out: Path) -> int:
    marks = [r["saved_at_step"] for g in (0, 1) for r in _lines(out, g) if "saved_at_step" in r]
    assert len(marks) == 1, marks  # one group wrote the checkpoint
    return marks[0]


@pytest.mark.parametrize("fault_tolerant", [False, True], ids=["plain", "fault_tolerant"])
def test_checkpoint_saved_while_degraded_resumes_exactly(
    killed_run: tuple[Path, str], tmp_path: Path, fault_tolerant: bool
) -> None:
    """A full restart (with or without fault tolerance) from the checkpoint the survivor wrote
    while training alone trains the rest of the epoch: with the steps committed before the save,
    every sample exactly once."""
    out, _ = killed_run
    saved = _saved_step(out)
    assert (out / "ckpt").is_dir()
    before = [
        i for g in (0, 1) for r in _ledger(out, g) if r["committed"] and r["step"] <= saved
        for i in r["ids"]
    ]  # fmt: skip
    flags = (
        ["--fault_tolerance", "--replica_groups", "2"]
        if fault_tolerant
        else ["--num_processes", "1"]
    )
    result = _launch(tmp_path, *flags, FT_SAMPLES=str(SAMPLES), FT_RESUME=str(out / "ckpt"))
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    after = _committed_ids(tmp_path, 2 if fault_tolerant else 1)
    assert sorted(before + after) == list(range(SAMPLES))
    first = _ledger(tmp_path, 0)[0]  # the step count resumed too: one per rank of the step
    assert first["step"] == saved + first["participants"]


def test_group_killed_during_gradient_allreduce_survivor_continues(tmp_path: Path) -> None:
    """Group 1 SIGKILLs itself inside the bucketed all-reduce, its collective under way (a hook
    in the training script around the session's cross-group all-reduce): the survivor never restarts,
    discards at most that step, commits the next one, and the group restarted heals."""
    pytest.importorskip("torchft")
    samples = 96  # the survivor, sleeping 1 s a step alone, outlasts a slow restart
    result = _launch(
        tmp_path, "--fault_tolerance", "--replica_groups", "2",
        FT_SAMPLES=str(samples), FT_KILL_GROUP="1", FT_KILL_AT="3", FT_KILL_IN_ALLREDUCE="1",
        FT_SLOW_ALONE="1.0",
    )  # fmt: skip
    killed = [r for r in _lines(tmp_path, 1) if r.get("killed_in_allreduce")]
    assert len(killed) == 1, result.stdout[-3000:] + result.stderr[-3000:]
    # The victim's samples count when the survivor committed the step they were averaged in: the
    # survivor's step after as many steps as the victim logged before it died (until then the two
    # trained every step together; by time, the victim may already be a step ahead).
    before = [r for r in _ledger(tmp_path, 1) if r["incarnation"] == 0]
    survivor = _ledger(tmp_path, 0)
    concurrent = survivor[len(before)]
    together = concurrent["committed"] and concurrent["participants"] == 2
    _check_run(result, tmp_path, samples, extra=tuple(killed[0]["ids"]) if together else ())
    discarded = [i for i, r in enumerate(survivor) if not r["committed"]]
    assert len(discarded) <= 1
    if discarded:  # the next step commits (alone, or with the healed group)
        assert survivor[discarded[0] + 1]["committed"]
    assert "replica group 1 lost at step" in result.stdout + result.stderr


def _windows(out: Path, group: int) -> list[tuple[bool, list[int]]]:
    """(committed, sample ids) of each accumulation window of `group`'s ledger."""
    windows, ids, incarnation = [], [], 0
    for record in _ledger(out, group):
        if record["incarnation"] != incarnation:  # a killed process's open window is gone
            ids, incarnation = [], record["incarnation"]
        ids += record["ids"]
        if record["synced"]:
            windows.append((record["committed"], ids))
            ids = []
    assert not ids, "a window never stepped: its samples were silently dropped"
    return windows


def test_fewer_tail_samples_than_ranks_is_refused() -> None:
    """The exactly-once loader itself (no process group): a dataset shorter than the participating
    ranks is a clear error on every rank; a longer tail is shared out, one sample apart at most."""
    import torch

    from cadence.fault_tolerance.loader import CursorLoader, StepView

    def ranks_of(samples: int, participants: int) -> list[list[int]]:
        shares = []
        for index in range(participants):
            data = torch.utils.data.DataLoader(list(range(samples)), batch_size=2)
            loader = CursorLoader(data, None, lambda i=index: StepView(participants, i))
            shares.append(next(iter(loader)).tolist())
        return shares

    assert ranks_of(5, 4) == [[0, 1], [2], [3], [4]]
    with pytest.raises(RuntimeError, match="last 3 samples are fewer than the participating ranks"):
        ranks_of(3, 4)


@pytest.mark.parametrize("seed", range(12))
def test_epoch_tails_stay_shareable_whatever_groups_come_and_go(seed: int) -> None:
    """The loader's tail rule over random quorums (campaign seed 1049's residual: a group back for
    an epoch's last step found fewer samples than ranks): groups of 1-2 ranks, 2-4 groups, each
    step drawn on 1..all groups from the printed seed, some steps discarded. Every step gives every
    rank at least one sample, every epoch's samples are committed once each, and a rank's batch
    exceeds `batch_size` only in an epoch's last step, by at most ceil((most - 1) / participants)."""
    import random

    import torch

    from cadence.fault_tolerance.loader import CursorLoader, StepView

    rng = random.Random(seed)
    per_group, groups, batch = rng.randint(1, 2), rng.randint(2, 4), rng.randint(1, 3)
    most = per_group * groups
    samples = rng.randint(most, 6 * most * batch)
    print(f"seed {seed}: {groups} groups x {per_group} ranks, batch {batch}, {samples} samples")
    data = torch.utils.data.DataLoader(list(range(samples)), batch_size=batch)
    view = StepView(most, 0, most)
    loader = CursorLoader(data, None, lambda: view)
    committed: list[int] = []
    for _ in range(20 * samples):  # bounded: a committed step takes at least one sample
        if loader.cursor >= samples:
            break
        participants = rng.randint(1, groups) * per_group
        before, shares = loader._pending, []
        for index in range(participants):
            loader._pending = before
            shares.append(loader._slice(StepView(participants, index, most)))
        assert all(len(share) >= 1 for share in shares), (seed, shares)
        left = samples - loader.cursor - loader._pending
        extra = -(-(most - 1) // participants)
        assert all(len(share) <= batch + (extra if left == 0 else 0) for share in shares), shares
        if rng.random() < 0.2:
            loader.end_step(False)
            continue
        committed += [i for share in shares for i in share]
        loader.end_step(True)
    assert sorted(committed) == list(range(samples)), seed


def test_min_replicas_above_survivors_waits_then_resumes_through_accumulation_windows(
    tmp_path: Path,
) -> None:
    """min_replicas=2, 3 micro-batches per optimizer step, group 1 SIGKILLed inside a window and
    restarted 6 s later: the survivor commits nothing alone, says why it waits, and resumes when
    the group is back. 42 samples at 4 per micro-step: after three whole windows the epoch ends in
    a window of two micro-batches whose last is the tail shared out one sample per group; it steps
    (the loader marks the end of the dataloader) and commits. Every sample exactly once."""
    pytest.importorskip("torchft")
    samples = 42
    result = _launch(
        tmp_path, "--fault_tolerance", "--replica_groups", "2", "--min_replicas", "2",
        FT_SAMPLES=str(samples), FT_KILL_GROUP="1", FT_KILL_AT="4", FT_RESTART_DELAY="6",
        FT_ACCUM="3",
    )  # fmt: skip
    text = result.stdout + result.stderr
    assert result.returncode == 0, text[-6000:]
    ids = sorted(i for g in (0, 1) for ok, window in _windows(tmp_path, g) if ok for i in window)
    assert ids == list(range(samples))
    survivor = _ledger(tmp_path, 0)
    assert {r["incarnation"] for r in survivor} == {0}
    assert {r["incarnation"] for r in _ledger(tmp_path, 1)} == {0, 1}
    # No step ever committed with fewer than two groups.
    assert all(r["participants"] == 2 for r in survivor if r["committed"] and r["synced"])
    assert "waits for a quorum" in text and "min_replicas=2" in text
    last = survivor[-2:]  # the shorter last window: two micro-batches, the second the tail
    assert [r["synced"] for r in last] == [False, True] and len(last[-1]["ids"]) == 1
    assert last[-1]["committed"]
    assert _weights(tmp_path, 0) == _weights(tmp_path, 1)


def test_group_returning_after_the_others_finished_does_not_train_again(tmp_path: Path) -> None:
    """Group 1 killed, restarted only after the survivor finished the epoch: alone at the job's
    step 0 with nobody to heal from, it refuses (clear message) instead of training every sample
    again."""
    pytest.importorskip("torchft")
    samples = 16
    result = _launch(
        tmp_path, "--fault_tolerance", "--replica_groups", "2", "--quorum_timeout", "4",
        "--max_restarts", "1",
        FT_SAMPLES=str(samples), FT_KILL_GROUP="1", FT_KILL_AT="2", FT_RESTART_DELAY="8",
    )  # fmt: skip
    text = result.stdout + result.stderr
    assert result.returncode != 0
    assert "restarted but found no other group within 4 s" in text, text[-4000:]
    assert {r["incarnation"] for r in _ledger(tmp_path, 1)} == {0}  # never trained again
    assert _committed_ids(tmp_path, 2) == list(range(samples))


def _refusal(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """`cadence launch` in this process (its parser and plan checks): refused with code 2."""
    from cadence.commands.cli import main

    code = main(["launch", "--cpu", *argv, str(SCRIPT)])
    err = capsys.readouterr().err
    assert code == 2, err
    assert "Nothing was started" in err
    return err


def test_fault_tolerance_without_torchft_is_a_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "torchft", None)  # as if not installed
    monkeypatch.setenv("FT_OUT", str(tmp_path))
    err = _refusal(["--fault_tolerance", "--replica_groups", "2"], capsys)
    assert "--fault_tolerance needs torchft, which is not installed" in err
    assert "pip install 'cadence[ft]'" in err
    assert not list(tmp_path.iterdir())  # nothing started


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--fault_tolerance"], "--fault_tolerance needs --replica_groups G"),
        (["--fault_tolerance", "--replica_group", "1"], "pass --lighthouse HOST:PORT too"),
        (["--fault_tolerance", "--lighthouse", "127.0.0.1:1"], "--lighthouse needs --replica_group"),
        (["--fault_tolerance", "--replica_groups", "2", "--min_replicas", "3"], "no step could ever commit"),
        (["--fault_tolerance", "--replica_groups", "2", "--heartbeat_timeout", "0"], "heartbeat_timeout must be more than 0"),
        (["--fault_tolerance", "--replica_groups", "2", "--quorum_every", "0"], "quorum_every must be a whole number of steps, 1 or more, got 0"),
        (["--fault_tolerance", "--replica_groups", "2", "--use_fsdp"], "--use_fsdp with --fault_tolerance"),
        (["--fault_tolerance", "--replica_groups", "2", "--use_deepspeed"], "--use_deepspeed with --fault_tolerance"),
    ],
)  # fmt: skip
def test_bad_fault_tolerance_flags_are_refused_before_start(
    flags: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("torchft")
    assert message in _refusal(flags, capsys)


def test_refusal_through_the_real_command_line(tmp_path: Path) -> None:
    """The one refusal run as a user runs it: the `cadence` CLI in its own process."""
    result = _launch(tmp_path, "--replica_groups", "2", timeout=120)
    assert result.returncode == 2, result.stderr
    assert "need --fault_tolerance" in result.stderr and "Nothing was started" in result.stderr
    assert not [p for p in tmp_path.iterdir()]  # no ledger: no worker ran


def test_fault_tolerance_config_in_code_is_checked() -> None:
    from cadence.fault_tolerance import FaultToleranceConfig

    with pytest.raises(ValueError, match="lighthouse is required"):
        FaultToleranceConfig()
    with pytest.raises(ValueError, match="replica_group must be in 0..1"):
        FaultToleranceConfig(lighthouse="http://127.0.0.1:1", replica_group=2, replica_groups=2)
    with pytest.raises(ValueError, match="quorum_every must be a whole number of steps"):
        FaultToleranceConfig(lighthouse="http://127.0.0.1:1", quorum_every=1.5)
    config = FaultToleranceConfig(lighthouse="http://127.0.0.1:1", replica_groups=2)
    assert FaultToleranceConfig.from_record(config.to_record()) == config


def test_session_hooks_survive_copies_and_pickling_of_the_users_model() -> None:
    """The session's hooks on a prepared model and its parameters: a deepcopy of the model (an
    EMA) shares them instead of copying the session, a pickled model loads with hooks that do
    nothing, and once the session is gone they do nothing."""
    import copy
    import gc
    import pickle

    import torch

    from cadence.fault_tolerance.hooks import SessionHook

    class Session:  # stands for the session: records what the hooks call, must never be copied
        def __init__(self) -> None:
            self.calls: list[str] = []

        def opened(self, module, args) -> None:
            self.calls.append("forward")

        def accumulated(self, parameter) -> None:
            self.calls.append("grad")

        def __deepcopy__(self, memo):
            raise AssertionError("the session was copied")

        def __reduce__(self):
            raise AssertionError("the session was pickled")

    session = Session()
    model = torch.nn.Linear(3, 1)
    model.register_forward_pre_hook(SessionHook(session, "opened"))
    model.weight.register_post_accumulate_grad_hook(SessionHook(session, "accumulated"))
    model(torch.ones(2, 3)).sum().backward()
    assert session.calls == ["forward", "grad"]
    twin = copy.deepcopy(model)  # an EMA's copy: its forward hook calls the same session
    twin(torch.ones(2, 3))  # (torch does not copy a parameter's hooks; the session checks anyway)
    assert session.calls == ["forward", "grad", "forward"]
    loaded = pickle.loads(pickle.dumps(model))
    loaded(torch.ones(2, 3)).sum().backward()  # inert hooks: nothing called
    assert session.calls == ["forward", "grad", "forward"]
    torch.testing.assert_close(loaded.weight, model.weight)
    del session, twin
    gc.collect()
    model(torch.ones(2, 3)).sum().backward()  # the session is gone: nothing to call


def _parallelism(kind: str) -> dict:
    import cadence

    if kind == "deepspeed":
        pytest.importorskip("deepspeed")
        return {"deepspeed_plugin": cadence.DeepSpeedPlugin(zero_stage=2)}
    if kind == "fsdp":
        return {"fsdp_plugin": cadence.FullyShardedDataParallelPlugin()}
    if kind == "tp_plugin":
        from cadence.utils import TorchTensorParallelPlugin

        return {"torch_tp_plugin": TorchTensorParallelPlugin(tp_size=2)}
    return {"parallelism_config": cadence.ParallelismConfig(**{kind: 2})}


@pytest.mark.parametrize(
    ("kind", "named"),
    [
        ("fsdp", "FSDP (fsdp_plugin / --use_fsdp)"),
        ("deepspeed", "DeepSpeed (deepspeed_plugin / --use_deepspeed)"),
        ("tp_plugin", "tensor parallelism (torch_tp_plugin)"),
        ("dp_shard_size", "FSDP2 sharding (HSDP) (dp_shard_size)"),
        ("tp_size", "tensor parallelism (tp_size)"),
        ("cp_size", "context parallelism (cp_size)"),
        ("pp_size", "pipeline parallelism (pp_size)"),
    ],
)
def test_parallelism_inside_a_group_other_than_ddp_is_refused_before_start(
    kind: str, named: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every parallelism but DDP inside a replica group, asked for in code, is refused by
    `Accelerator()` before anything starts (no process group, no Lighthouse contact: the
    Lighthouse address here has nothing behind it)."""
    pytest.importorskip("torchft")
    import torch

    from cadence import Accelerator
    from cadence.fault_tolerance import FaultToleranceConfig

    monkeypatch.setenv("ACCELERATE_ALLOW_CP_STANDALONE", "true")  # cp without FSDP gets this far
    config = FaultToleranceConfig(lighthouse="http://127.0.0.1:1", replica_group=1)
    with pytest.raises(ValueError) as refused:
        Accelerator(cpu=True, kwargs_handlers=[config], **_parallelism(kind))
    message = str(refused.value)
    assert f"fault tolerance (replica group 1) cannot train with {named}" in message
    assert "DDP over the group's processes" in message  # what is supported
    assert not torch.distributed.is_initialized()
