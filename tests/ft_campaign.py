"""The randomized fault campaign: a scenario drawn from a seed, run through `cadence launch
--fault_tolerance` on loopback, checked on invariants rather than examples.

The space: 2-3 replica groups of 1-2 processes, gradient accumulation 1-3, the DataLoader kinds a
user writes (shuffle=True without a generator, with one, use_seedable_sampler, drop_last, a
fixed-size BatchSampler, shuffle=False), three script idioms (tests/ft_scripts/ft_campaign_train.py),
0-2 failures (SIGKILL or SIGTERM) at uniformly drawn moments of the whole run: any epoch's training
(inside an accumulation window too), an evaluation, a `save_state`, a second one while the first
group heals or in the restarted group itself (one group always survives: when every group is lost
at once nobody holds the job, which `cadence` refuses to continue; tests/test_fault_tolerance_epochs.py
checks that refusal); `--quorum_every` 1 or 16.

The invariants, for every scenario:
- every launcher exits 0; no process of the run is left behind; the groups finish within seconds of
  each other;
- over committed steps, every sample of every finished epoch is trained exactly once (drop_last:
  at most once, and only a tail shorter than a step is left), never twice in the last one;
- every rank of every group ends with the same weights, the same registered counter and learning
  rate, equal to a one-process replay of the committed steps;
- every evaluation of an epoch (by any group, restarted ones included) gives the evaluation of the
  replay's weights at that epoch's end, over the whole eval set.

`python tests/ft_campaign.py --seed S` replays one scenario (`make campaign SEED=S`);
`python tests/ft_campaign.py --runs N` draws N (`make campaign N=200`); `--elastic` drives the
elastic launcher instead (tests/elastic_campaign.py: a stop notice or a join at a random moment,
either start order, save on one size and resume on the other). Each run prints its seed and
scenario on one line. A seed that fails becomes a case of tests/test_fault_campaign.py.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

SCRIPT = Path(__file__).parent / "ft_scripts" / "ft_campaign_train.py"
SRC = Path(__file__).resolve().parents[1] / "src"
LOADERS = ("shuffle", "shuffle_gen", "seedable", "drop_last", "batch_sampler", "sequential")
IDIOMS = ("epochs", "no_trainer", "step_total")
BATCH = 2
EVAL_SAMPLES = 22  # not a multiple of the eval batch: the last evaluation batch is short


def draw(seed: int) -> dict[str, Any]:
    """The scenario of `seed`: every choice drawn from it, nothing else."""
    rng = random.Random(seed)
    groups = rng.choice((2, 3))
    nproc = rng.choice((1, 1, 2))
    accum = rng.choice((1, 2, 3))
    epochs = rng.choice((2, 3))
    # A multiple of every participating rank count (1-6) times the batch: the epoch's tail is
    # never smaller than the ranks that share it.
    samples = BATCH * 12 * rng.choice((3, 4)) if groups * nproc <= 4 else BATCH * 12 * 5
    per_rank = samples // (BATCH * groups * nproc)  # micro-batches a rank draws an epoch, all in
    scenario: dict[str, Any] = {
        "seed": seed,
        "groups": groups,
        "nproc": nproc,
        "accum": accum,
        "epochs": epochs,
        "samples": samples,
        "batch": BATCH,
        "eval_samples": EVAL_SAMPLES,
        "loader": rng.choice(LOADERS),
        "idiom": rng.choice(IDIOMS),
        "quorum_every": rng.choice((1, 16)),
        "end_training": rng.random() < 0.5,
        "slow": 0.4,
        "save_every": rng.choice((3, 5)),
        # LinearLR over the schedule a one-process run of every epoch would take.
        "schedule": epochs * samples // BATCH,
        "kills": [],
    }
    scenario["total"] = int(rng.uniform(0.5, 0.9) * scenario["schedule"])
    evals_per_epoch = -(-EVAL_SAMPLES // (4 * nproc))
    for number in range(rng.choice((0, 1, 1, 2))):
        group, incarnation = rng.randrange(groups), 0
        phase = rng.choices(("train", "eval", "save"), weights=(6, 2, 1))[0]
        if phase == "save" and scenario["idiom"] != "no_trainer":
            phase = "train"  # only the no_trainer idiom saves
        if phase == "train":
            # Anywhere in the first incarnation's run, every epoch, with the others in.
            at = rng.randint(1, max(1, int(per_rank * epochs * 0.85)))
        elif phase == "eval":
            at = rng.randint(1, evals_per_epoch * epochs)
        else:
            at = rng.randint(1, 2)
        if number == 1:
            first = scenario["kills"][0]
            if groups == 3:  # another group, often while the first heals: one group survives
                group = rng.choice([g for g in range(groups) if g != first["group"]])
                if first["phase"] == "train" and rng.random() < 0.5:
                    phase, at = "train", first["at"] + rng.randint(0, 3)
            else:  # two groups: the restarted one fails again (the other holds the job)
                group, incarnation, phase = first["group"], 1, "train"
                at = rng.randint(1, max(1, per_rank))
        signal = rng.choice(("KILL", "KILL", "TERM"))
        scenario["kills"].append(
            {"group": group, "incarnation": incarnation, "phase": phase, "at": at, "signal": signal}
        )
    # Drawn last, so the scenarios of earlier seeds stay as they were: the epoch loop calls
    # model.train() only once a batch is drawn, as transformers' Trainer does.
    scenario["late_train_mode"] = scenario["idiom"] == "epochs" and rng.random() < 0.4
    return scenario


def describe(scenario: dict[str, Any]) -> str:
    """The scenario on one line."""
    kills = ", ".join(
        f"{k['signal']} group {k['group']}.{k['incarnation']} at {k['phase']} #{k['at']}"
        for k in scenario["kills"]
    )
    return (
        f"seed {scenario['seed']}: {scenario['groups']} groups x {scenario['nproc']}, accum "
        f"{scenario['accum']}, {scenario['epochs']} epochs of {scenario['samples']}, loader "
        f"{scenario['loader']}, idiom {scenario['idiom']}, quorum_every "
        f"{scenario['quorum_every']}, end_training {scenario['end_training']}, "
        f"{'model.train() after the draw, ' if scenario.get('late_train_mode') else ''}failures: "
        f"{kills or 'none'}"
    )


def run(scenario: dict[str, Any], out: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    """Launch the scenario's job into `out` (bounded by `timeout`)."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "scenario.json").write_text(json.dumps(scenario))
    argv = [
        sys.executable, "-m", "cadence.commands.cli", "launch", "--cpu", "--fault_tolerance",
        "--replica_groups", str(scenario["groups"]), "--nproc_per_node", str(scenario["nproc"]),
        "--quorum_every", str(scenario["quorum_every"]),
        "--max_restarts", str(scenario.get("max_restarts", 3)),
        str(SCRIPT), str(out),
    ]  # fmt: skip
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(SRC), env.get("PYTHONPATH", "")])
    try:
        return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as late:
        text = [
            t.decode() if isinstance(t, bytes) else (t or "") for t in (late.stdout, late.stderr)
        ]
        return subprocess.CompletedProcess(argv, -9, text[0], text[1] + f"\n[timed out: {timeout}]")


def _rows(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _left_behind(out: Path) -> list[int]:
    """Processes whose command line names the run's folder."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if str(out) in cmdline:
            found.append(int(entry.name))
    return found


def replay(scenario: dict[str, Any], steps: dict[int, list[dict]]) -> tuple[Any, list[Any], float]:
    """One process replays the committed steps in order: per step, each participating rank's
    windows (the sum of its micro-batches' gradients of the mean squared error, divided by the
    accumulation steps and scaled by the window's factor), averaged over the step's ranks; SGD with
    momentum steps, and the LinearLR once per participating rank. Returns the model, its weights
    after each step (by the step's epoch: the weights at each epoch's end), and the last lr."""
    import torch

    script = _script()
    data = script.Samples(scenario["samples"], 0)
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.5)
    scheduler = torch.optim.lr_scheduler.LinearLR(
        optimizer, start_factor=1.0, end_factor=0.25, total_iters=scenario["schedule"]
    )
    at_epoch_end: dict[int, list[float]] = {}
    for step in sorted(steps):
        records = steps[step]
        total = [torch.zeros_like(p) for p in model.parameters()]
        for record in records:
            for ids in record["mbs"]:
                model.zero_grad()
                index = torch.tensor(ids)
                loss = torch.nn.functional.mse_loss(model(data.x[index]), data.y[index])
                (loss / scenario["accum"] * record["factor"]).backward()
                total = [t + p.grad for t, p in zip(total, model.parameters())]
        for parameter, summed in zip(model.parameters(), total):
            parameter.grad = summed / len(records)
        if scenario.get("clip"):  # the average's norm, as DDP's clip sees it
            torch.nn.utils.clip_grad_norm_(model.parameters(), scenario["clip"])
        optimizer.step()
        for _ in records:
            scheduler.step()
        epoch = records[0]["epoch"]
        at_epoch_end[epoch] = torch.cat([p.detach().flatten() for p in model.parameters()]).tolist()
    return model, at_epoch_end, scheduler.get_last_lr()[0]


def _stops_early(scenario: dict[str, Any]) -> bool:
    """Whether the scenario's loop stops before the last epoch's end."""
    return scenario["idiom"] == "step_total" or bool(scenario.get("max_steps"))


def _script():
    """The campaign's training script as a module (its dataset)."""
    from harness import load_script

    return load_script(SCRIPT, "ft_campaign_train")


def check(scenario: dict[str, Any], out: Path, result: subprocess.CompletedProcess) -> None:
    """Assert every invariant of the module docstring on the run in `out`."""
    import torch

    text = result.stdout + result.stderr
    where = f"{describe(scenario)}\n--- output (tail) ---\n{text[-5000:]}"
    assert result.returncode == 0, f"launcher exited {result.returncode}\n{where}"
    deadline = time.monotonic() + 10
    while _left_behind(out) and time.monotonic() < deadline:  # bounded: exits are under way
        time.sleep(0.2)
    assert not _left_behind(out), f"processes left behind: {_left_behind(out)}\n{where}"
    groups, nproc = scenario["groups"], scenario["nproc"]
    ranks = [(g, r) for g in range(groups) for r in range(nproc)]
    finals = {k: json.loads((out / f"weights.{k[0]}.{k[1]}.json").read_text()) for k in ranks}
    for marker in out.glob("killed.*"):  # a failure that fired: its group came back, healed
        group = int(marker.name.split(".")[1])
        assert all(finals[(group, r)]["inc"] > 0 for r in range(nproc)), (marker.name, where)
    ends = [f["t"] for f in finals.values()]
    assert max(ends) - min(ends) < 40, (
        f"groups finished {max(ends) - min(ends):.1f} s apart\n{where}"
    )
    # The committed steps: step number -> the windows of its participating ranks.
    steps: dict[int, list[dict]] = {}
    for group, rank in ranks:
        seen = set()
        for record in _rows(out / f"ledger.{group}.{rank}.jsonl"):
            if record["committed"]:
                assert record["step"] not in seen, (
                    f"{group}.{rank} committed {record['step']} twice"
                )
                seen.add(record["step"])
                steps.setdefault(record["step"], []).append(record)
    numbers = sorted(steps)
    assert numbers == list(range(len(numbers))), f"committed steps not 0..n-1: {numbers}\n{where}"
    for number, records in steps.items():
        assert {r["participants"] for r in records} == {len(records)}, (number, records, where)
    # Every sample of every epoch once (the last epoch of step_total: at most once).
    by_epoch: dict[int, list[int]] = {}
    for records in steps.values():
        for record in records:
            by_epoch.setdefault(record["epoch"], []).extend(i for mb in record["mbs"] for i in mb)
    samples = scenario["samples"]
    last = max(by_epoch) if by_epoch else -1
    for epoch, ids in by_epoch.items():
        assert len(ids) == len(set(ids)), f"epoch {epoch}: samples trained twice\n{where}"
        partial = _stops_early(scenario) and epoch == last
        if scenario["loader"] == "drop_last":
            assert samples - len(ids) < BATCH * groups * nproc or partial, (epoch, len(ids), where)
        elif not partial:
            assert sorted(ids) == list(range(samples)), f"epoch {epoch} incomplete\n{where}"
    if not _stops_early(scenario):
        assert sorted(by_epoch) == list(range(scenario["epochs"])), (sorted(by_epoch), where)
    elif scenario.get("max_steps"):
        # A group that never restarted counts every optimizer step it took, committed or
        # discarded (a discarded step is a skipped one, as an fp16 overflow's), up to
        # max_train_steps; the job commits no step past that.
        steady = [
            g
            for g in range(groups)
            if {r["inc"] for r in _rows(out / f"ledger.{g}.0.jsonl")} == {0}
        ]
        counted = [len(_rows(out / f"ledger.{g}.0.jsonl")) for g in steady]
        assert scenario["max_steps"] in counted, (counted, where)
        assert len(numbers) <= scenario["max_steps"], (len(numbers), where)
    # The same weights everywhere, the replay's.
    model, at_epoch_end, lr = replay(scenario, steps)
    expected = torch.cat([p.detach().flatten() for p in model.parameters()])
    for key, final in finals.items():
        got = torch.tensor(final["weights"])
        assert got.tolist() == finals[ranks[0]]["weights"], (
            f"{key} differs from {ranks[0]}\n{where}"
        )
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6, msg=where)
        assert final["progress"] == len(numbers), (key, final["progress"], len(numbers), where)
        assert abs(final["lr"] - lr) < 1e-9, (key, final["lr"], lr, where)
    # Every evaluation of an epoch: the replay's weights at its end, over the whole eval set.
    data = _script().Samples(scenario["eval_samples"], 7)
    for group, rank in ranks:
        for record in _rows(out / f"eval.{group}.{rank}.jsonl"):
            assert record["n"] == scenario["eval_samples"], (group, rank, record, where)
            weights = at_epoch_end[record["epoch"]]
            w, b = torch.tensor(weights[:4]), weights[4]
            mse = ((data.x @ w + b - data.y.flatten()) ** 2).mean().item()
            assert abs(record["mse"] - mse) <= 1e-5 * max(1.0, mse), (
                group,
                rank,
                record,
                mse,
                where,
            )
    evaluated = {r["epoch"] for r in _rows(out / "eval.0.0.jsonl")}
    if not _stops_early(scenario):
        assert evaluated == set(range(scenario["epochs"])), (evaluated, where)
    if scenario["idiom"] == "no_trainer":
        # Each epoch's checkpoint, complete; one group writes it, so one its writer was lost in
        # before it committed is missing (docs: Training through failures, limits).
        fired = any(out.glob("killed.*"))
        for epoch in range(scenario["epochs"]):
            folder = out / "checkpoints" / f"epoch_{epoch}"
            assert fired or folder.is_dir(), f"no checkpoint epoch_{epoch}\n{where}"
        for folder in (out / "checkpoints").iterdir():
            if not folder.name.startswith("."):
                assert (folder / "cadence_manifest.json").is_file(), (folder.name, where)


def campaign(seed: int, keep: bool = False) -> tuple[bool, str]:
    """Run and check the scenario of `seed`; returns (passed, its line or the failure)."""
    scenario = draw(seed)
    line = describe(scenario)
    print(line, flush=True)
    with tempfile.TemporaryDirectory(prefix=f"ft-campaign-{seed}-") as folder:
        out = Path(folder) / "run"
        started = time.monotonic()
        result = run(scenario, out)
        try:
            check(scenario, out, result)
        except AssertionError as failure:
            if keep:
                kept = Path(tempfile.mkdtemp(prefix=f"ft-campaign-failed-{seed}-"))
                subprocess.run(["cp", "-r", str(out), str(kept)], check=False)
                print(f"  kept in {kept}", flush=True)
            return False, f"FAILED {line}\n{failure}"
        fired = len({m.name.rsplit(".", 1)[0] for m in out.glob("killed.*")})
        return True, f"passed in {time.monotonic() - started:.0f} s ({fired} failures fired)"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, help="replay this scenario")
    parser.add_argument("--runs", type=int, default=1, help="scenarios to draw (default 1)")
    parser.add_argument("--first", type=int, default=None, help="the first seed of --runs")
    parser.add_argument("--keep", action="store_true", help="keep the folders of failed runs")
    parser.add_argument(
        "--elastic", action="store_true", help="the elastic half (tests/elastic_campaign.py)"
    )
    args = parser.parse_args()
    if args.seed is not None:
        seeds = [args.seed]
    else:
        first = args.first if args.first is not None else random.SystemRandom().randrange(10**6)
        seeds = list(range(first, first + args.runs))
    failed = []
    for seed in seeds:
        if args.elastic:
            from elastic_campaign import elastic_campaign  # the launcher's half, on request

            passed, report = elastic_campaign(seed)
        else:
            passed, report = campaign(seed, keep=args.keep)
        print(report.splitlines()[0] if passed else report, flush=True)
        if not passed:
            failed.append(seed)
    print(f"campaign: {len(seeds) - len(failed)} of {len(seeds)} scenarios passed; failed seeds: "
          f"{failed or 'none'}", flush=True)  # fmt: skip
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
