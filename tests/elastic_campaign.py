"""The fault campaign's elastic half: two `cadence launch --nnodes 1:2` nodes on 127.0.0.1
(tests/elastic_helpers.py), one membership change drawn from a seed, checked on the same
exactly-once invariant as the fault-tolerance half (tests/ft_campaign.py).

The space: a stop notice to node b (to its launcher or to its worker) after a random number of
steps trained together, in either start order; node b killed (SIGKILL to its launcher and workers)
after a random number of steps, in either start order, the job saving every 2-4 steps; node b
joining a node training alone after a random number of steps; the epoch size. The invariants: the
launchers exit as the event says (b with 75, "resume me", after a notice; a with 0 after a kill;
both 0 after a join), the job ends at the size the event leaves, every sample of both DataLoaders
(shuffled and sequential) trained exactly once per epoch across the save on one size and the
resume on the other (after a kill: the job resumes from the last checkpoint committed before it,
and the samples of the steps trained after that checkpoint, and only those, are trained twice),
and nothing left running.

`python tests/ft_campaign.py --elastic --seed S` replays one scenario (`make campaign ELASTIC=1`).
"""

from __future__ import annotations

import os
import random
import signal
import tempfile
from pathlib import Path
from typing import Any

from elastic_helpers import (
    TRAIN_SCRIPT,
    assert_trained,
    children,
    kill_node,
    start_node,
    start_two_nodes,
    steps,
    stop_all,
    wait_until,
)

EPOCHS = 2


def draw_elastic(seed: int) -> dict[str, Any]:
    """The elastic scenario of `seed`."""
    rng = random.Random(seed)
    event = rng.choice(("notice_launcher", "notice_worker", "join", "kill"))
    save_every = rng.randint(2, 4) if event == "kill" else 0
    return {
        "seed": seed,
        "event": event,
        "order": "host-first" if event == "join" else rng.choice(("host-first", "non-host-first")),
        # A kill lands after the first checkpoint (a job with none starts again from nothing).
        "after": rng.randint(save_every + 1, 10)
        if event == "kill"
        else rng.randint(1, 8)
        if event != "join"
        else rng.randint(1, 5),
        "samples": rng.choice((32, 48)),
        "save_every": save_every,
    }


def describe_elastic(scenario: dict[str, Any]) -> str:
    """The scenario on one line."""
    saves = f", a checkpoint every {scenario['save_every']} steps" if scenario["save_every"] else ""
    return (
        f"elastic seed {scenario['seed']}: {scenario['event']} after {scenario['after']} steps, "
        f"{scenario['order']}, {EPOCHS} epochs of {scenario['samples']}{saves}"
    )


def run_and_check_elastic(scenario: dict[str, Any], folder: Path) -> None:
    """Run the scenario in `folder` and assert its invariants (see the module docstring)."""
    script = folder / "train.py"
    script.write_text(TRAIN_SCRIPT)
    where = describe_elastic(scenario)
    env = {"SAMPLES": str(scenario["samples"])}
    processes = []
    try:
        if scenario["event"] == "join":
            from harness import free_port

            env.update(STEP_SLEEP="0.05", STEP_SLEEP_ALONE="1.0")
            port = free_port()
            first = start_node(folder, port, "a", script, **env)
            processes.append(first)
            alone = lambda: len(steps(folder)) >= scenario["after"]  # noqa: E731
            assert wait_until(lambda: alone() or first.poll() is not None, limit=180), where
            assert first.poll() is None, f"{where}: a ended before b joined"
            second = start_node(folder, port, "b", script, **env)
            processes.append(second)
            assert first.wait(timeout=240) == 0, f"{where}: a failed"
            assert second.wait(timeout=90) == 0, f"{where}: b failed"
            worlds = [r["world"] for r in steps(folder)]
            assert worlds[0] == 1 and worlds[-1] == 2, (worlds, where)
        else:
            env.update(STEP_SLEEP="0.3", STEP_SLEEP_ALONE="0.02")
            if scenario["save_every"]:
                env.update(SAVE_EVERY=str(scenario["save_every"]))
            first, second = start_two_nodes(
                folder,
                script,
                scenario["order"],
                own_session=scenario["event"] == "kill",
                rdzv_conf="keep_alive_max_attempt=10",
                START_TOGETHER="1",
                **env,
            )
            processes += [first, second]
            together = lambda: (  # noqa: E731
                sum(r["world"] == 2 and "samples" in r for r in steps(folder)) >= scenario["after"]
            )
            ended = lambda: first.poll() is not None or second.poll() is not None  # noqa: E731
            assert wait_until(lambda: together() or ended(), limit=240) and together(), where
            if scenario["event"] == "kill":
                kill_node(second)
                assert first.wait(timeout=240) == 0, f"{where}: a did not finish alone"
                _check_resumed_from_last_checkpoint(steps(folder), scenario, where)
                return
            if scenario["event"] == "notice_launcher":
                second.send_signal(signal.SIGTERM)
            else:
                workers = children(second.pid)
                assert len(workers) == 1, (workers, where)
                os.kill(workers[0], signal.SIGTERM)
            assert second.wait(timeout=120) == 75, f"{where}: b did not ask to be resumed"
            assert first.wait(timeout=240) == 0, f"{where}: a did not finish alone"
            worlds = [r["world"] for r in steps(folder)]
            assert 2 in worlds and worlds[-1] == 1, (worlds, where)
    finally:
        stop_all(*processes)
    records = steps(folder)
    assert_trained(records, EPOCHS, scenario["samples"], where=f"{where}: ")


def _check_resumed_from_last_checkpoint(
    records: list[dict], scenario: dict[str, Any], where: str
) -> None:
    """After a kill: one resume, at world size 1, from the last checkpoint committed before the
    kill (a checkpoint the main process came back from, or a later one it was writing), then to
    the end; the samples of the steps trained after that checkpoint twice, every other once."""
    resumed = [r for r in records if r.get("kind") == "resumed"]
    assert len(resumed) == 1 and resumed[0]["world"] == 1, (resumed, where)
    at = resumed[0]["step"]
    before = [r for r in records if r["time"] < resumed[0]["time"]]
    trained = [r["step"] for r in before if "samples" in r]
    saved = [r["step"] for r in before if r.get("kind") == "saved"]
    assert saved and at % scenario["save_every"] == 0 and max(saved) <= at <= max(trained), (
        f"{where}: resumed at step {at}, saved {saved}, trained up to {max(trained)}"
    )
    after = [r for r in records if r["time"] > resumed[0]["time"]]
    assert after and all(r["world"] == 1 for r in after), where
    numbers = [r["step"] for r in after if "samples" in r]
    assert numbers == list(range(at + 1, at + 1 + len(numbers))), (where, at, numbers[:8])
    redone = [r for r in before if "samples" in r and r["step"] > at]
    assert_trained(records, EPOCHS, scenario["samples"], redone, where=f"{where}: ")


def elastic_campaign(seed: int) -> tuple[bool, str]:
    """Run and check the elastic scenario of `seed`; returns (passed, its line or the failure)."""
    scenario = draw_elastic(seed)
    line = describe_elastic(scenario)
    print(line, flush=True)
    with tempfile.TemporaryDirectory(prefix=f"elastic-campaign-{seed}-") as folder:
        try:
            run_and_check_elastic(scenario, Path(folder))
        except AssertionError as failure:
            return False, f"FAILED {line}\n{failure}"
    return True, f"passed: {line}"
