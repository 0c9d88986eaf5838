"""Hostile and damaged checkpoints (issue 13, items 1-4 and 6), across 2 real gloo processes.

Every hostile file is built by the test from a checkpoint that save_state wrote. Each case checks
that load_state raises a CheckpointError subclass, that no object changed, and (item 1) that no
code in a pickle ran.
"""

from __future__ import annotations

import json
import os
import pickle
import shutil

import pytest
import torch

from harness import WorkerError

MANIFEST = "cadence_manifest.json"


class Counter:
    """A registered object with a plain state."""

    def __init__(self):
        self.value = 0

    def state_dict(self):
        return {"value": self.value}

    def load_state_dict(self, state):
        self.value = state["value"]


class Exploding(Counter):
    """Its load_state_dict fails after the states before it were applied."""

    def load_state_dict(self, state):
        raise RuntimeError("this object refuses every state")


class Point:
    """A Python object only full unpickling can restore."""

    def __init__(self, x=0):
        self.x = x


class PickledThing(Counter):
    def state_dict(self):
        return {"point": Point(self.value)}

    def load_state_dict(self, state):
        self.value = state["point"].x


class FlakyLinear(torch.nn.Linear):
    """Copies its weights, then fails: a model whose loading breaks half-way."""

    fail = False

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)
        if FlakyLinear.fail:
            raise RuntimeError("half-way failure")


class Payload:
    """Unpickling it creates a file: proof that code ran."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


def build(groups=1, width=3, extra=(), flaky=False, shuffle=True):
    from cadence import Accelerator

    torch.manual_seed(0)
    acc = Accelerator(cpu=True)
    layer = FlakyLinear if flaky else torch.nn.Linear
    model = torch.nn.Sequential(torch.nn.Linear(4, width), layer(width, 1))
    if groups == 1:
        optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
    else:
        optimizer = torch.optim.AdamW(
            [{"params": model[0].parameters()}, {"params": model[1].parameters(), "lr": 0.1}]
        )
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.5)
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(32, 4, generator=generator)
    loader = torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(x, x.sum(1, keepdim=True)), batch_size=4, shuffle=shuffle
    )
    model, optimizer, loader, scheduler = acc.prepare(model, optimizer, loader, scheduler)
    for obj in extra:
        acc.register_for_checkpointing(obj)
    return acc, model, optimizer, loader, scheduler


def train(acc, model, optimizer, loader, scheduler, steps=2):
    iterator = iter(loader)
    for _ in range(steps):
        x, y = next(iterator)
        acc.backward(torch.nn.functional.mse_loss(model(x), y))
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()


def snapshot(acc, model, optimizer, scheduler, loader, extra=()):
    """Everything load_state may change, copied."""
    import copy
    import random

    return {
        "model": {k: v.clone() for k, v in acc.unwrap_model(model).state_dict().items()},
        "optimizer": copy.deepcopy(optimizer.state_dict()),
        "scheduler": copy.deepcopy(scheduler.state_dict()),
        "loader": copy.deepcopy(loader.state_dict()),
        "torch_rng": torch.get_rng_state().clone(),
        "python_rng": random.getstate(),
        "step": acc.step,
        "extra": [copy.deepcopy(o.state_dict()) for o in extra],
    }


def same(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.shape == b.shape and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return (
            isinstance(b, (list, tuple))
            and len(a) == len(b)
            and all(same(x, y) for x, y in zip(a, b))
        )
    if isinstance(a, Point):
        return isinstance(b, Point) and a.x == b.x
    return a == b


def save_checkpoint(folder, extra_kind=None):
    extra = {None: [], "pickle": [PickledThing()]}[extra_kind]
    for obj in extra:
        obj.value = 7
    job = build(extra=extra)
    train(*job)
    return job[0].save_state(folder)


def load_and_report(folder, marker=None, load_kwargs=None, **build_kwargs):
    """Load into fresh objects (trained differently); report the error and whether anything changed."""
    from cadence.checkpointing import CheckpointError

    extra = build_kwargs.pop("extra", ())
    job = build(extra=extra, **build_kwargs)
    acc, model, optimizer, loader, scheduler = job
    train(*job, steps=3)
    before = snapshot(acc, model, optimizer, scheduler, loader, extra)
    error = None
    try:
        acc.load_state(folder, load_kwargs=load_kwargs)
    except CheckpointError as e:
        error = e
    after = snapshot(acc, model, optimizer, scheduler, loader, extra)
    return {
        "error": None if error is None else type(error).__name__,
        "message": "" if error is None else str(error),
        "is_value_error": isinstance(error, ValueError),
        "unchanged": same(before, after),
        "code_ran": marker is not None and os.path.exists(marker),
    }


def _manifest(folder):
    with open(os.path.join(folder, MANIFEST)) as f:
        return json.load(f)


def _write_manifest(folder, data=None, text=None):
    with open(os.path.join(folder, MANIFEST), "w") as f:
        f.write(text if text is not None else json.dumps(data))


@pytest.fixture
def saved(dist_pool, tmp_path):
    folder = str(tmp_path / "ckpt")
    dist_pool(2).run(save_checkpoint, folder)
    return folder


# ----------------------------------------------------------------------------- item 1
@pytest.mark.parametrize("allow_pickle", [True, False])
def test_pickle_payload_padded_to_size_is_refused_before_any_code_runs(
    dist_pool, saved, tmp_path, allow_pickle
):
    target = os.path.join(saved, "optimizer.bin")
    size = os.path.getsize(target)
    marker = str(tmp_path / "code-ran")
    payload = pickle.dumps(Payload(marker), protocol=2)
    assert len(payload) < size
    with open(target, "wb") as f:  # same size as the original: the manifest's size check passes
        f.write(payload + b"\0" * (size - len(payload)))
    kwargs = {"load_kwargs": {"weights_only": False}} if allow_pickle else {}
    for result in dist_pool(2).run(load_and_report, saved, marker, **kwargs):
        assert result["error"] == "CheckpointCorruptError"
        assert "optimizer.bin: content changed since the save" in result["message"]
        assert result["unchanged"]
        assert not result["code_ran"]
    # Control: the same payload, loaded without the manifest check, does run code.
    with open(target, "rb") as f, pytest.raises(RuntimeError, match="magic number"):
        torch.load(f, weights_only=False)  # runs the payload, then notices the bad format
    assert os.path.exists(marker)


# ----------------------------------------------------------------------------- item 2
@pytest.mark.parametrize(
    ("build_kwargs", "phrase"),
    [
        ({"groups": 2}, "different number of parameter groups"),
        ({"width": 5}, "has shape (3, 4) in the checkpoint, (5, 4) in the model"),
        ({"shuffle": False}, "dataloader 0: the checkpoint has random generators"),
    ],
)
def test_state_that_does_not_fit_changes_nothing(dist_pool, saved, build_kwargs, phrase):
    for result in dist_pool(2).run(load_and_report, saved, **build_kwargs):
        assert result["error"] == "CheckpointMismatchError"
        assert result["is_value_error"]  # the reference raises ValueError for param groups
        assert phrase in result["message"]
        assert result["unchanged"]


def rewrite_rng_state(folder):
    """A checkpoint whose RNG file is well-formed and checksummed but not an RNG state."""
    import torch.distributed as dist

    from cadence.checkpointing import begin_checkpoint, open_checkpoint

    rank = dist.get_rank()
    with open_checkpoint(folder) as reader:
        files = {n: reader.read_bytes(n) for n in reader.names()}
    dist.barrier()  # both ranks read the folder before rank 0 replaces it
    if rank == 0:
        writer = begin_checkpoint(folder, rank=0)
        for name, data in files.items():
            writer.save_bytes(name, data)
        writer.save_object("random_states_1.pkl", {"random_state": [1, 2], "torch_manual_seed": 5})
        writer.commit()


def test_rng_state_with_wrong_layout_changes_nothing(dist_pool, saved):
    dist_pool(2).run(rewrite_rng_state, saved)
    results = dist_pool(2).run(load_and_report, saved)
    assert results[0]["error"] is None  # rank 0's files are intact
    assert results[1]["error"] == "CheckpointMismatchError"
    assert "'random_state' is not a Python random state" in results[1]["message"]
    assert results[1]["unchanged"]


def load_with_failing_apply(folder, where):
    FlakyLinear.fail = where == "model"
    try:
        extra = [Exploding()] if where == "object" else []
        return load_and_report(folder, flaky=True, extra=extra)
    finally:
        FlakyLinear.fail = False


def save_flaky(folder, with_object):
    job = build(flaky=True, extra=[Counter()] if with_object else [])
    train(*job)
    job[0].save_state(folder)


@pytest.mark.parametrize("where", ["object", "model"])
def test_failure_while_applying_restores_what_was_applied(dist_pool, tmp_path, where):
    folder = str(tmp_path / "ckpt")
    dist_pool(2).run(save_flaky, folder, where == "object")
    for result in dist_pool(2).run(load_with_failing_apply, folder, where):
        assert result["error"] == "CheckpointMismatchError"
        assert "restored" in result["message"]
        assert result["unchanged"]


# ----------------------------------------------------------------------------- item 3
def _set_size(folder, name, size):
    data = _manifest(folder)
    data["files"][name]["size"] = size
    _write_manifest(folder, data)


@pytest.mark.parametrize("kind", ["fifo", "dev_zero", "folder"])
def test_special_files_are_refused_without_hanging(dist_pool, saved, kind):
    target = os.path.join(saved, "optimizer.bin")
    os.unlink(target)
    if kind == "fifo":
        os.mkfifo(target)
    elif kind == "dev_zero":
        os.symlink("/dev/zero", target)
    else:
        os.mkdir(target)
    _set_size(saved, "optimizer.bin", 0)
    # The harness kills a call that takes more than 60 s: a hang fails the test.
    for result in dist_pool(2).run(load_and_report, saved, timeout=60):
        assert result["error"] == "CheckpointCorruptError"
        assert "optimizer.bin" in result["message"]
        assert result["unchanged"]


def test_character_device_is_refused(dist_pool, saved):
    target = os.path.join(saved, "optimizer.bin")
    os.unlink(target)
    try:
        os.mknod(target, 0o600 | 0o020000, os.makedev(1, 5))  # /dev/zero's numbers
    except PermissionError:
        pytest.skip("creating a device file needs root")
    _set_size(saved, "optimizer.bin", 0)
    for result in dist_pool(2).run(load_and_report, saved, timeout=60):
        assert result["error"] == "CheckpointCorruptError"
        assert "character device" in result["message"]
        assert result["unchanged"]


# ----------------------------------------------------------------------------- item 4
def test_symlinked_file_pointing_outside_is_refused_even_with_the_right_content(
    dist_pool, saved, tmp_path
):
    target = os.path.join(saved, "optimizer.bin")
    outside = tmp_path / "elsewhere.bin"
    shutil.copyfile(target, outside)  # same bytes: size and checksum would pass
    os.unlink(target)
    os.symlink(outside, target)
    for result in dist_pool(2).run(load_and_report, saved):
        assert result["error"] == "CheckpointCorruptError"
        assert "outside the checkpoint folder" in result["message"]
        assert result["unchanged"]


def _listed_outside(folder, name):
    data = _manifest(folder)
    data["files"][name] = {"size": 10, "checksum": "00"}
    _write_manifest(folder, data)


def _number(folder, field, text):
    raw = open(os.path.join(folder, MANIFEST)).read()
    data = json.loads(raw)
    if field == "size":
        data["files"]["optimizer.bin"]["size"] = 1234567
        raw = json.dumps(data).replace("1234567", text)
    else:
        data[field] = 1234567
        raw = json.dumps(data).replace("1234567", text)
    _write_manifest(folder, text=raw)


@pytest.mark.parametrize(
    ("damage", "phrase"),
    [
        (lambda f: _listed_outside(f, "/etc/passwd"), "is an absolute path"),
        (lambda f: _listed_outside(f, "../outside.bin"), "'..' component"),
        (lambda f: _listed_outside(f, "a/./b"), "'.' or '..' component"),
        (lambda f: _number(f, "size", "1e400"), "'size' must be an integer"),
        (lambda f: _number(f, "format_version", "1e400"), "'format_version' must be an integer"),
        (lambda f: _number(f, "world_size", "9" * 5000), "not valid JSON"),
        (lambda f: _write_manifest(f, text="[" * 100_000), "nested too deeply"),
        (
            lambda f: _write_manifest(f, text='{"format": "cadence-checkpoint", "files": []}'),
            "'format_version' is missing",
        ),
        (lambda f: _write_manifest(f, text="\xff\xfe"), "manifest"),
    ],
)
def test_malformed_manifests_raise_checkpoint_errors(dist_pool, saved, damage, phrase):
    damage(saved)
    for result in dist_pool(2).run(load_and_report, saved):
        assert result["error"] == "CheckpointCorruptError", result["message"]
        assert phrase in result["message"]
        assert result["unchanged"]


def test_a_hostile_newest_checkpoint_is_skipped_when_resuming(tmp_path):
    from cadence.checkpointing import begin_checkpoint, latest_checkpoint

    root = tmp_path / "checkpoints"
    for i in range(2):
        writer = begin_checkpoint(root / f"checkpoint_{i}", durable=False)
        writer.save_bytes("state.bin", b"x" * 10)
        writer.commit()
    _write_manifest(root / "checkpoint_1", text="[" * 100_000)
    assert latest_checkpoint(root).name == "checkpoint_0"
    _write_manifest(
        root / "checkpoint_1", text='{"format": "cadence-checkpoint", "format_version": 1e400}'
    )
    assert latest_checkpoint(root).name == "checkpoint_0"


# ----------------------------------------------------------------------------- item 6
def save_pickled(folder):
    save_checkpoint(folder, extra_kind="pickle")


def load_pickled(folder, how):
    thing = PickledThing()
    job = build(extra=[thing])
    kwargs = {"none": {}, "load_kwargs": {"load_kwargs": {"weights_only": False}}}.get(how)
    if how == "allow_pickle":
        kwargs = {"allow_pickle": True}
    job[0].load_state(folder, **kwargs)
    return thing.value


def test_the_refusal_advice_works(dist_pool, tmp_path):
    folder = str(tmp_path / "ckpt")
    dist_pool(2).run(save_pickled, folder)
    with pytest.raises(WorkerError) as info:
        dist_pool(2).run(load_pickled, folder, "none")
    text = str(info.value)
    assert "UnsafeCheckpointError" in text
    assert "allow_pickle=True" in text and "load_kwargs={'weights_only': False}" in text
    # Both pieces of advice work.
    assert dist_pool(2).run(load_pickled, folder, "allow_pickle") == [7, 7]
    assert dist_pool(2).run(load_pickled, folder, "load_kwargs") == [7, 7]


def test_flipped_byte_in_a_large_file_is_caught(tmp_path):
    """Files over 1 MB are hashed through a mapping; a flip must still be caught, in both readers."""
    from cadence.checkpointing import CheckpointCorruptError, begin_checkpoint, open_checkpoint

    writer = begin_checkpoint(tmp_path / "c", durable=False)
    writer.save_tensors("big.safetensors", {"w": torch.randn(1 << 20)})  # 4 MB
    writer.save_object("big.bin", {"w": torch.randn(1 << 20)})
    writer.commit()
    for name in ("big.safetensors", "big.bin"):
        path = tmp_path / "c" / name
        with open(path, "r+b") as f:
            f.seek(3 << 20)
            byte = f.read(1)
            f.seek(3 << 20)
            f.write(bytes([byte[0] ^ 1]))
    with open_checkpoint(tmp_path / "c") as reader:
        with pytest.raises(CheckpointCorruptError, match="big.safetensors: content changed"):
            reader.load_tensors("big.safetensors")
        with pytest.raises(CheckpointCorruptError, match="big.bin: content changed"):
            reader.load_object("big.bin")
