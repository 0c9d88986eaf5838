"""Whole checkpoints across real launches (issues 24 and 27): saved on 2 processes, resumed on 1, 2,
3 and 4; saved per worker (each rank into its own folder) and merged by a plain copy.

One save launch (2 processes) trains a shuffled epoch and saves after 2 steps into a shared folder
and into one folder per rank, then finishes the epoch uninterrupted. Each resume launch loads, checks
that the model and optimizer equal the saved ones, and finishes the epoch: together with the save
run's first 2 steps, every sample of the epoch is trained on exactly once. The resume on 2 from the
merged per-worker folders ends bit-identical to the uninterrupted run.
"""

from __future__ import annotations

import shutil
import textwrap

import pytest
from elastic_helpers import launch_local

from cadence.checkpointing import CheckpointError, read_manifest

SIZE = 112  # batch 4: 16 samples after 2 steps on 2 processes, 96 left (a multiple of 4 * M)

SCRIPT = textwrap.dedent(
    """
    import json, os, sys
    import torch
    torch.set_num_threads(1)
    from cadence import Accelerator

    mode, workdir = sys.argv[1], sys.argv[2]
    acc = Accelerator(cpu=True)
    torch.manual_seed(0)
    features = torch.randn(SIZE_HERE, 4, generator=torch.Generator().manual_seed(1))
    dataset = torch.utils.data.TensorDataset(torch.arange(SIZE_HERE), features)
    loader = torch.utils.data.DataLoader(dataset, batch_size=4, shuffle=True)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Dropout(0.3), torch.nn.Linear(8, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
    model, optimizer, loader = acc.prepare(model, optimizer, loader)
    rank = acc.process_index

    def snapshot():
        state = {"model": {k: v.clone() for k, v in acc.unwrap_model(model).state_dict().items()}}
        opt = optimizer.state_dict()
        state["optimizer"] = {f"{i}.{k}": v.clone() if torch.is_tensor(v) else torch.tensor(v)
                              for i, s in opt["state"].items() for k, v in s.items()}
        return state

    report = {"rank": rank, "world": acc.num_processes}
    if mode != "save":
        acc.load_state(os.path.join(workdir, mode))
        saved = torch.load(os.path.join(workdir, "saved.pt"))
        now = snapshot()
        report["equal_after_load"] = all(
            torch.equal(saved[part][k], now[part][k]) for part in saved for k in saved[part]
        ) and all(set(saved[p]) == set(now[p]) for p in saved)
    seen = []
    for step, (ids, x) in enumerate(loader):
        seen += ids.tolist()
        loss = model(x).pow(2).mean()
        acc.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        if mode == "save" and step == 1:
            acc.save_state(os.path.join(workdir, "shared"))
            acc.save_state(os.path.join(workdir, f"worker{rank}"))  # each rank its own folder
            if rank == 0:
                torch.save(snapshot(), os.path.join(workdir, "saved.pt"))
            report["seen_at_save"] = list(seen)
    report["seen"] = seen
    report["final"] = [p.detach().flatten().tolist() for p in acc.unwrap_model(model).parameters()]
    with open(os.path.join(workdir, f"{mode}-{acc.num_processes}-{rank}.json"), "w") as f:
        json.dump(report, f)
    """.replace("SIZE_HERE", str(SIZE))
)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("elastic")
    (workdir / "train.py").write_text(SCRIPT)
    reports = launch_local(workdir, 2, "save")
    merged = workdir / "merged"
    merged.mkdir()
    for rank in range(2):  # what Ray (or any uploader of per-worker folders) does: a plain union
        shutil.copytree(workdir / f"worker{rank}", merged, dirs_exist_ok=True)
    return workdir, reports


def test_per_worker_folders_hold_only_what_each_rank_owns(saved):
    workdir, _ = saved
    worker1 = sorted(p.name for p in (workdir / "worker1").iterdir())
    assert "model.safetensors" not in worker1 and "optimizer.bin" not in worker1
    assert "random_states_1.pkl" in worker1 and "cadence_manifest.rank1.json" in worker1
    # No name stands in two folders: Ray Train copies the folders into one concurrently, and two
    # copies of one name written at once tear the file (seen: a folder manifest with "Extra data").
    worker0 = sorted(p.name for p in (workdir / "worker0").iterdir())
    assert not set(worker0) & set(worker1), set(worker0) & set(worker1)
    assert "cadence_manifest.json" in worker0
    manifest = read_manifest(workdir / "merged")
    assert manifest.world_size == 2 and manifest.ranks == [0, 1]
    assert manifest.owners["random_states_1.pkl"] == 1
    assert manifest.owners["model.safetensors"] == 0
    # One worker's folder alone is not the checkpoint: the error names the missing rank and file.
    with pytest.raises(CheckpointError, match=r"rank 0: its part is missing \(cadence_manifest"):
        read_manifest(workdir / "worker1")


def test_a_missing_rank_file_is_an_error_naming_it(saved, tmp_path):
    workdir, _ = saved
    broken = tmp_path / "broken"
    shutil.copytree(workdir / "merged", broken)
    (broken / "cadence_manifest.rank1.json").unlink()
    with pytest.raises(CheckpointError, match="rank 1: its part is missing"):
        read_manifest(broken)
    shutil.rmtree(broken)
    shutil.copytree(workdir / "merged", broken)
    (broken / "random_states_1.pkl").unlink()
    with pytest.raises(CheckpointError, match="random_states_1.pkl: missing"):
        from cadence.checkpointing import verify

        verify(broken, "sizes")


def test_merged_per_worker_checkpoint_resumes_bit_identical(saved):
    workdir, uninterrupted = saved
    resumed = launch_local(workdir, 2, "merged")
    for before, after in zip(uninterrupted, resumed):
        assert after["equal_after_load"]
        assert before["seen_at_save"] + after["seen"] == before["seen"]
        assert after["final"] == before["final"]


@pytest.mark.parametrize("processes", [1, 3, 4])
def test_resume_on_another_number_of_processes(saved, processes):
    workdir, uninterrupted = saved
    resumed = launch_local(workdir, processes, "shared")
    assert all(r["equal_after_load"] for r in resumed)
    before = [s for r in uninterrupted for s in r["seen_at_save"]]
    after = [s for r in resumed for s in r["seen"]]
    assert sorted(before + after) == list(range(SIZE))  # every sample of the epoch exactly once
