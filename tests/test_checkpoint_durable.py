"""Durability of saving and loading (issue 24, item 6), each with real processes where it matters:
a pending asynchronous save commits before the interpreter exits; after load_state nothing refers
to the checkpoint's files; a load of a checkpoint deleted underneath fails as a CheckpointError."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

from cadence import Accelerator
from cadence.checkpointing import CheckpointCorruptError, CheckpointError, open_checkpoint
from cadence.utils import ProjectConfiguration

SRC = str(Path(__file__).resolve().parents[1] / "src")


def _run(script: str, *args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=SRC + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )


def _state():
    torch.manual_seed(0)
    model = torch.nn.Linear(64, 64)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model(torch.randn(8, 64)).sum().backward()
    optimizer.step()
    optimizer.zero_grad()
    return model, optimizer


ASYNC_THEN_END = """
import sys, torch
from cadence import Accelerator
torch.manual_seed(0)
model = torch.nn.Linear(256, 256)
optimizer = torch.optim.AdamW(model.parameters())
model(torch.randn(4, 256)).sum().backward()
optimizer.step()
accelerator = Accelerator(cpu=True)
model, optimizer = accelerator.prepare(model, optimizer)
torch.save(model.state_dict(), sys.argv[2])
accelerator.save_state(sys.argv[1], async_save=True)
# the script ends here: no wait, no end_training
"""


def test_async_save_pending_at_the_end_of_the_script_commits(tmp_path):
    out = tmp_path / "ckpt"
    done = _run(ASYNC_THEN_END, str(out), str(tmp_path / "expected.pt"))
    assert done.returncode == 0, done.stderr
    assert "failed" not in done.stderr, done.stderr
    model = torch.nn.Linear(256, 256)
    optimizer = torch.optim.AdamW(model.parameters())
    accelerator = Accelerator(cpu=True)
    model, optimizer = accelerator.prepare(model, optimizer)
    accelerator.load_state(out)
    expected = torch.load(tmp_path / "expected.pt", weights_only=True)
    for name, value in model.state_dict().items():
        assert torch.equal(value, expected[name]), name


ASYNC_FAILS_AT_END = """
import time
from cadence.checkpointing.async_writer import AsyncCheckpointSaver
def write():
    time.sleep(0.5)  # still running when the script ends
    raise OSError(28, "No space left on device")
AsyncCheckpointSaver().submit(write)
"""


def test_async_save_failing_at_exit_ends_the_process_non_zero():
    done = _run(ASYNC_FAILS_AT_END)
    assert done.returncode == 1, (done.returncode, done.stderr)
    assert "was not committed" in done.stderr, done.stderr
    assert "No space left on device" in done.stderr, done.stderr


LOAD_THEN_CLOBBER = """
import os, sys, torch
from cadence import Accelerator
ckpt, width = sys.argv[1], int(sys.argv[2])
def make():
    torch.manual_seed(0)
    model = torch.nn.Linear(width, width)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model(torch.randn(8, width)).sum().backward()
    optimizer.step()
    optimizer.zero_grad()
    return model, optimizer
accelerator = Accelerator(cpu=True)
model, optimizer = accelerator.prepare(*make())
accelerator.save_state(ckpt)
with torch.no_grad():
    for p in model.parameters():
        p.add_(1.0)  # differs from the checkpoint until load_state
accelerator.load_state(ckpt)
def snapshot():
    return ({k: v.clone() for k, v in model.state_dict().items()},
            {k: {n: t.clone() for n, t in s.items() if isinstance(t, torch.Tensor)}
             for k, s in optimizer.state_dict()["state"].items()})
before = snapshot()
names = [os.path.join(d, f) for d, _, fs in os.walk(ckpt) for f in fs]
for name in names:  # rewrite every file in place, then truncate it
    size = os.path.getsize(name)
    with open(name, "r+b") as f:
        f.write(b"\\xff" * size)
        f.flush()
        os.fsync(f.fileno())
for name in names:
    os.truncate(name, 0)
after = snapshot()
for key in before[0]:
    assert torch.equal(before[0][key], after[0][key]), key
for key in before[1]:
    for n in before[1][key]:
        assert torch.equal(before[1][key][n], after[1][key][n]), (key, n)
model(torch.randn(8, width)).sum().backward()
optimizer.step()  # touches every optimizer state tensor (SIGBUS if one still mapped a file)
print("STEPPED", len(names), flush=True)
"""


@pytest.mark.parametrize("width", [512, 1536])  # 1536: hashed by a second thread while read
def test_after_load_state_nothing_refers_to_the_checkpoint_files(tmp_path, width):
    # A subprocess: were a state tensor still a view of a truncated file, the step would end the
    # process with SIGBUS.
    done = _run(LOAD_THEN_CLOBBER, str(tmp_path / "ckpt"), str(width))
    assert done.returncode == 0, (done.returncode, done.stderr[-3000:])
    assert "STEPPED" in done.stdout


def _saved(tmp_path, value: float, name: str) -> Path:
    accelerator = Accelerator(cpu=True)
    model = torch.nn.Linear(256, 256)
    optimizer = torch.optim.AdamW(model.parameters())
    model, optimizer = accelerator.prepare(model, optimizer)
    model(torch.randn(2, 256)).sum().backward()
    optimizer.step()
    with torch.no_grad():
        for p in model.parameters():
            p.fill_(value)
        for state in optimizer.state.values():
            state["exp_avg"].fill_(value)
    return Path(accelerator.save_state(tmp_path / name))


@pytest.mark.parametrize("name", ["model.safetensors", "optimizer.bin"])
def test_file_rewritten_after_its_verification_cannot_reach_the_caller(tmp_path, name):
    good = _saved(tmp_path, 1.0, "good")
    other = _saved(tmp_path, 2.0, "other")
    assert (good / name).stat().st_size == (other / name).stat().st_size
    with open_checkpoint(good) as reader:
        reader.prefetch([name])
        reader._prefetched[name].result()  # read and verified: now the file changes on disk
        with open(good / name, "r+b") as f:
            f.write((other / name).read_bytes())
        loaded = (
            reader.load_tensors(name)
            if name.endswith(".safetensors")
            else (reader.load_object(name))
        )
    tensors = (
        loaded
        if name.endswith(".safetensors")
        else {
            f"{k}.{n}": t
            for k, s in loaded["state"].items()
            for n, t in s.items()
            if n == "exp_avg"
        }
    )
    assert tensors and all(torch.all(t == 1.0) for t in tensors.values())  # the verified bytes
    # and the same rewrite before the read is refused: the check covers what is deserialized
    with open_checkpoint(good) as reader, pytest.raises(CheckpointCorruptError, match="changed"):
        reader.load_tensors(name) if name.endswith(".safetensors") else reader.load_object(name)


def test_checkpoint_deleted_between_listing_and_reading_is_a_checkpoint_error(tmp_path):
    path = _saved(tmp_path, 1.0, "ckpt")
    with open_checkpoint(path) as reader:  # manifest read, sizes checked
        shutil.rmtree(path)  # rotation removes it now
        with pytest.raises(CheckpointError, match="optimizer.bin: missing"):
            reader.load_object("optimizer.bin")
        with pytest.raises(CheckpointError, match="model.safetensors: missing"):
            reader.load_tensors("model.safetensors")
    accelerator = Accelerator(cpu=True)
    accelerator.prepare(torch.nn.Linear(256, 256))
    with pytest.raises(CheckpointError, match="does not exist"):
        accelerator.load_state(path)


@pytest.mark.parametrize("what", ["missing", "a file"])
def test_load_state_of_no_folder_says_it_as_accelerate_does(tmp_path, what):
    # Accelerate raises ValueError("Tried to find <dir> but folder does not exist"): scripts and
    # tests written for it match that text and catch ValueError.
    path = tmp_path / "ckpt"
    if what == "a file":
        path.write_text("not a checkpoint")
    accelerator = Accelerator(cpu=True)
    accelerator.prepare(torch.nn.Linear(2, 2))
    with pytest.raises(ValueError, match=f"^Tried to find {path} but folder does not exist"):
        accelerator.load_state(str(path))


SAVE_AND_ROTATE = """
import sys, torch
from cadence import Accelerator
from cadence.utils import ProjectConfiguration
config = ProjectConfiguration(project_dir=sys.argv[1], automatic_checkpoint_naming=True,
                              total_limit=1)
accelerator = Accelerator(cpu=True, project_config=config)
model = accelerator.prepare(torch.nn.Linear(512, 512))
if int(sys.argv[2]) > 1:
    accelerator.load_state()  # resume: continues the numbering
for _ in range(int(sys.argv[2])):
    accelerator.save_state()  # each save deletes the previous checkpoint
"""


def test_load_while_rotation_deletes_checkpoints_fails_only_with_checkpoint_errors(tmp_path):
    project = tmp_path / "project"
    first = _run(SAVE_AND_ROTATE, str(project), "1")  # one checkpoint to start from
    assert first.returncode == 0, first.stderr
    env = dict(os.environ, PYTHONPATH=SRC + os.pathsep + os.environ.get("PYTHONPATH", ""))
    saver = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(SAVE_AND_ROTATE), str(project), "40"],
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    config = ProjectConfiguration(project_dir=str(project), automatic_checkpoint_naming=True)
    accelerator = Accelerator(cpu=True, project_config=config)
    accelerator.prepare(torch.nn.Linear(512, 512))
    loaded, failures = 0, []
    deadline = time.monotonic() + 240
    try:
        for _ in range(400):
            if saver.poll() is not None or time.monotonic() > deadline:
                break
            try:
                accelerator.load_state()
                loaded += 1
            except Exception as e:  # every failure must be a CheckpointError saying what happened
                failures.append(e)
    finally:
        saver.wait(timeout=240)
    assert saver.returncode == 0, saver.stderr.read()[-3000:]
    wrong = [f"{type(e).__name__}: {e}" for e in failures if not isinstance(e, CheckpointError)]
    assert not wrong, wrong
    assert all(str(e) for e in failures)
    assert loaded > 0


def _as_accelerate_writes_it(folder: Path) -> Path:
    """The folder Accelerate's save_state writes: the same files without Cadence's records (the
    manifests and the per-rank dataloader positions)."""
    for name in os.listdir(folder):
        if name.startswith("cadence_") or name.startswith("dl_state_dict"):
            os.remove(folder / name)
    return folder


@pytest.mark.parametrize("how", ["refused", "argument", "environment"])
def test_a_checkpoint_accelerate_wrote_loads_only_when_asked_to(tmp_path, monkeypatch, how):
    # Accelerate writes no manifest, so its checkpoints cannot be verified: refused by default (a
    # Cadence folder without one is a torn or damaged one), loaded as they are when asked to.
    folder = _as_accelerate_writes_it(_saved(tmp_path, 3.0, "from_accelerate"))
    accelerator = Accelerator(cpu=True)
    model = torch.nn.Linear(256, 256)
    optimizer = torch.optim.AdamW(model.parameters())
    model, optimizer = accelerator.prepare(model, optimizer)
    if how == "refused":
        with pytest.raises(CheckpointError, match="allow_unverified=True") as raised:
            accelerator.load_state(str(folder))
        assert "CADENCE_LOAD_UNVERIFIED=1" in str(raised.value)
        assert not (model.weight == 3.0).any()  # nothing applied
        return
    if how == "environment":
        monkeypatch.setenv("CADENCE_LOAD_UNVERIFIED", "1")
        accelerator.load_state(str(folder))
    else:
        accelerator.load_state(str(folder), allow_unverified=True)
    assert (model.weight == 3.0).all() and (model.bias == 3.0).all()
    assert all((s["exp_avg"] == 3.0).all() for s in optimizer.state.values())
