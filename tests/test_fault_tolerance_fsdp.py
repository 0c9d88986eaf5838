"""FSDP2 inside a fault-tolerant replica group (HSDP with torchft's replication across groups,
issue 36): a real `cadence launch --fault_tolerance` run of 2 groups x 2 processes on loopback, one
group SIGKILLed and healed; and which parallelism a group accepts, walked over its combinations."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from sharded_helpers import needs_fsdp2_on_cpu
from test_fault_tolerance import (
    SCRIPT,
    _env,
    _script,
    two_groups_of_two_killed_and_healed,
)
from test_fault_tolerance import _replay as replay_steps

HIDDEN = 8  # FT_MLP: an MLP whose 8-row layers split 4 / 4 over a group's two ranks
CLIP = 0.5  # the run clips the gradient norm to this: the norm of the average over every rank


def _replay(steps: dict[int, list[dict]], samples: int) -> list[float]:
    """One process replays the committed steps of the ledger (first principles: data-parallel
    training, FSDP2's included, averages the per-rank mean gradients): for each step, the gradient
    of every participating rank's batch, averaged over them, its norm clipped, then SGD with
    momentum, and the
    scheduler stepped once per participating rank (as Accelerate's prepared scheduler advances
    once per process without split_batches). Returns the final weights."""
    import torch

    data = _script().Indexed(samples)
    torch.manual_seed(0)  # the script's model, built as it builds it
    model = torch.nn.Sequential(
        torch.nn.Linear(4, HIDDEN), torch.nn.ReLU(), torch.nn.Linear(HIDDEN, HIDDEN),
        torch.nn.ReLU(), torch.nn.Linear(HIDDEN, 1),
    )  # fmt: skip
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    return replay_steps(steps, data, model, optimizer, clip=CLIP)


@needs_fsdp2_on_cpu
def test_fsdp2_groups_kill_heal_exactly_once_and_full_weights_match_replay(
    tmp_path: Path,
) -> None:
    """2 replica groups x 2 processes, each group's model sharded with FSDP2 over its two ranks
    (SGD with momentum: sharded optimizer state). Group 1 is SIGKILLed between steps and restarted
    by its agent; its ranks heal from group 0's same ranks (model and momentum shards). Every
    sample is trained exactly once, the survivor never restarts, the four ranks end with the same
    full weights, and those are one process's replay of the committed steps, clip_grad_norm_
    included (FSDP2's norm over the group's shards, of gradients averaged across the groups)."""
    pytest.importorskip("torchft")
    import torch

    samples = 124  # as the DDP test of two-process groups
    ledgers, text = two_groups_of_two_killed_and_healed(
        tmp_path, samples, FT_FSDP2="1", FT_MLP=str(HIDDEN), FT_MOMENTUM="0.9", FT_CLIP=str(CLIP)
    )
    healed_step = int(text.split("group 1 healed from group 0 at step ")[-1].split()[0])
    assert healed_step > 3  # the last heal is the restarted group's, after the kill
    alone = [r for r in ledgers[(0, 0)] if r["committed"] and r["participants"] == 2]
    assert alone  # the survivor trained steps without group 1
    runs = [json.loads((tmp_path / f"weights.{g}.{k}.json").read_text()) for g in (0, 1) for k in (0, 1)]  # fmt: skip
    assert all(run["weights"] == runs[0]["weights"] for run in runs)  # full weights, every rank
    assert len(runs[0]["weights"]) == 4 * HIDDEN + HIDDEN + HIDDEN * HIDDEN + HIDDEN + HIDDEN + 1
    steps: dict[int, list[dict]] = {}
    for rows in ledgers.values():
        for record in rows:
            if record["committed"]:
                steps.setdefault(record["step"], []).append(record)
    torch.testing.assert_close(
        torch.tensor(runs[0]["weights"]),
        torch.tensor(_replay(steps, samples)),
        rtol=1e-5,
        atol=1e-6,
    )


def _plugins(kind: str) -> dict:
    import cadence

    fsdp2 = {"fsdp_plugin": cadence.FullyShardedDataParallelPlugin(fsdp_version=2)}
    if kind == "fsdp2":
        return fsdp2
    if kind == "fsdp1":
        return {"fsdp_plugin": cadence.FullyShardedDataParallelPlugin(fsdp_version=1)}
    if kind == "ddp_mesh":  # replication alone: DDP written as a ParallelismConfig
        return {"parallelism_config": cadence.ParallelismConfig(dp_replicate_size=2)}
    sizes = {
        "fsdp2_dp_shard": {"dp_shard_size": 2},
        "dp_shard_alone": {"dp_shard_size": 2},
        "fsdp2_hsdp": {"dp_replicate_size": 2, "dp_shard_size": 2},
        "fsdp2_cp": {"dp_shard_size": 2, "cp_size": 2},
        "fsdp2_tp": {"dp_shard_size": 2, "tp_size": 2},
    }[kind]
    found = {"parallelism_config": cadence.ParallelismConfig(**sizes)}
    return found if kind == "dp_shard_alone" else {**fsdp2, **found}


@pytest.mark.parametrize(
    ("kind", "refused"),
    [
        ("fsdp2", None),
        ("fsdp2_dp_shard", None),
        ("ddp_mesh", None),
        ("fsdp1", "FSDP (fsdp_plugin / --use_fsdp) with fsdp_version=1"),
        ("dp_shard_alone", "FSDP2 sharding (HSDP) (dp_shard_size) without fsdp_version=2"),
        ("fsdp2_hsdp", "HSDP inside a group (dp_replicate_size) with dp_shard_size > 1"),
        ("fsdp2_cp", "context parallelism (cp_size)"),
        ("fsdp2_tp", "tensor parallelism (tp_size)"),
    ],
)
def test_fsdp_version_and_mesh_inside_a_group(
    kind: str, refused: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The settings' check (run by `Accelerator()` before anything starts) over FSDP's version
    and the ParallelismConfig's dimensions: FSDP2 sharded over the group (with or without
    dp_shard_size) and plain DDP are accepted; FSDP1, dp_shard_size without FSDP2, HSDP inside a
    group, and context / tensor parallelism next to FSDP2 are refused, each named."""
    from cadence.fault_tolerance import FaultToleranceConfig
    from cadence.fault_tolerance.config import check_parallelism

    monkeypatch.setenv("ACCELERATE_ALLOW_CP_STANDALONE", "true")
    config = FaultToleranceConfig(lighthouse="http://127.0.0.1:1", replica_group=1)
    if refused is None:
        check_parallelism(config, **_plugins(kind))
        return
    with pytest.raises(ValueError) as error:
        check_parallelism(config, **_plugins(kind))
    message = str(error.value)
    assert f"fault tolerance (replica group 1) cannot train with {refused} inside" in message
    assert "FSDP2 sharded over the group's processes" in message  # what is supported


@pytest.mark.parametrize(
    ("version", "code"), [("2", 0), ("1", 2)], ids=["fsdp2_accepted", "fsdp1_refused"]
)
def test_launcher_fsdp_version_with_fault_tolerance(
    version: str, code: int, capsys: pytest.CaptureFixture[str]
) -> None:
    """`cadence launch --fault_tolerance --use_fsdp`: --fsdp_version 2 passes the launcher's checks
    (a dry run: nothing starts), version 1 is refused before anything starts."""
    pytest.importorskip("torchft")
    from cadence.commands.cli import main

    argv = ["launch", "--fault_tolerance", "--replica_groups", "2", "--nproc_per_node", "2",
            "--use_fsdp", "--fsdp_version", version, "--dry_run", str(SCRIPT)]  # fmt: skip
    assert main(argv) == code
    err = capsys.readouterr().err
    if code:
        assert "--use_fsdp with --fault_tolerance needs --fsdp_version 2" in err
        assert "Nothing was started" in err


def test_groups_of_different_process_counts_are_refused(tmp_path: Path) -> None:
    """One Lighthouse and two groups launched apart (`--lighthouse`), of 1 and 2 processes: rank r
    of each group could not hold the same shard nor take the same slice of a step, so the first
    exchange between the groups (the heal at the job's start) is refused with an error that names
    both process counts; no group trains with the other."""
    pytest.importorskip("torchft")
    import socket
    import subprocess
    import sys

    with socket.socket() as probe:  # a free port for the Lighthouse (bound again just after)
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    cli = [sys.executable, "-m", "cadence.commands.cli"]
    lighthouse = subprocess.Popen(
        [*cli, "lighthouse", "--bind", f"127.0.0.1:{port}"],
        env=_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    runs: list[subprocess.Popen] = []
    outs = [tmp_path / f"group{index}" for index in range(2)]
    try:
        # The group of one process restarts once: Cadence's store for it is its agent's.
        flags = ["--fault_tolerance", "--lighthouse", f"127.0.0.1:{port}", "--replica_groups", "2",
                 "--quorum_timeout", "5"]  # fmt: skip
        for index, (nproc, restarts) in enumerate([("1", "1"), ("2", "0")]):
            outs[index].mkdir()
            argv = [*flags, "--replica_group", str(index), "--nproc_per_node", nproc,
                    "--max_restarts", restarts]  # fmt: skip
            with open(tmp_path / f"output{index}.txt", "w") as output:  # no pipe to fill
                runs.append(
                    subprocess.Popen(
                        [*cli, "launch", "--cpu", *argv, str(SCRIPT)],
                        env=_env(FT_OUT=str(outs[index]), FT_SAMPLES="8"),
                        stdout=output,
                        stderr=subprocess.STDOUT,
                    )
                )
        for run in runs:
            run.wait(timeout=180)
    finally:
        for run in runs:
            if run.poll() is None:
                run.kill()
                run.wait()
        lighthouse.terminate()
        lighthouse.wait(timeout=30)
    texts = [(tmp_path / f"output{index}.txt").read_text() for index in range(2)]
    said = "every replica group must run the same number of processes"
    assert any(said in text for text in texts), texts[1][-4000:]
    assert any(run.returncode != 0 for run in runs)
    for index, size in enumerate((1, 2)):  # each group's ranks alone: never trained together
        for path in outs[index].glob("ledger.*.jsonl"):
            rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
            assert all(r["participants"] == size for r in rows if r.get("committed")), rows
