"""Formats stay readable: checkpoints in the manifest format of earlier Cadence versions (written
here file by file, as those versions did), and safetensors files from the fast writer read by the
`safetensors` package itself."""

from __future__ import annotations

import hashlib
import json
import os
import time
import zlib

import pytest
import torch


def _digest(path, algorithm):
    data = open(path, "rb").read()
    if algorithm == "sha256":
        return hashlib.sha256(data).hexdigest()
    if algorithm == "crc32":
        return f"{zlib.crc32(data):08x}"
    xxhash = pytest.importorskip("xxhash")
    return xxhash.xxh3_128(data).hexdigest()


def _build(seed):
    from cadence import Accelerator

    torch.manual_seed(seed)
    acc = Accelerator(cpu=True)
    model = torch.nn.Sequential(torch.nn.Linear(4, 6), torch.nn.Linear(6, 2))
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
    model, optimizer, scheduler = acc.prepare(model, optimizer, scheduler)
    model(torch.randn(3, 4)).sum().backward()
    optimizer.step()
    scheduler.step()
    return acc, model, optimizer, scheduler


def _write_old_checkpoint(folder, model, optimizer, scheduler, algorithm):
    """The layout and manifest of Cadence's first checkpoint format, written without Cadence."""
    from safetensors.torch import save_file

    from cadence.checkpointing import capture_rng_state

    os.makedirs(folder)
    save_file(
        {k: v.contiguous() for k, v in model.state_dict().items()},
        os.path.join(folder, "model.safetensors"),
        metadata={"format": "pt"},
    )
    torch.save(optimizer.state_dict(), os.path.join(folder, "optimizer.bin"))  # reference layout
    torch.save(scheduler.state_dict(), os.path.join(folder, "scheduler.bin"))
    torch.save(capture_rng_state(step=3), os.path.join(folder, "random_states_0.pkl"))
    files = {}
    for name in sorted(os.listdir(folder)):
        path = os.path.join(folder, name)
        files[name] = {"size": os.path.getsize(path), "checksum": _digest(path, algorithm)}
    created = time.time()
    manifest = {
        "format": "cadence-checkpoint",
        "format_version": 1,
        "created": created,
        "created_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(created)),
        "cadence_version": "0.1.0",
        "torch_version": torch.__version__,
        "world_size": 1,
        "ranks": [0],
        "checksum_algorithm": algorithm,
        "metadata": {"cadence_files_by": "save_state", "step": 3},
        "files": files,
    }
    with open(os.path.join(folder, "cadence_manifest.json"), "w") as f:
        f.write(json.dumps(manifest, indent=1) + "\n")


@pytest.mark.parametrize("algorithm", ["sha256", "crc32", "xxh3_128"])
def test_checkpoints_in_the_first_format_still_load(tmp_path, algorithm):
    import copy

    _, model, optimizer, scheduler = _build(seed=0)
    folder = str(tmp_path / "old")
    _write_old_checkpoint(folder, model, optimizer, scheduler, algorithm)
    expected_model = {k: v.clone() for k, v in model.state_dict().items()}
    expected_optimizer = copy.deepcopy(optimizer.state_dict())
    expected_scheduler = scheduler.state_dict()

    from cadence.state import reset_state

    reset_state()
    acc, model2, optimizer2, scheduler2 = _build(seed=1)
    acc.load_state(folder)
    assert all(torch.equal(expected_model[k], v) for k, v in model2.state_dict().items())
    state = optimizer2.state_dict()
    assert state["param_groups"] == expected_optimizer["param_groups"]
    for key, entry in expected_optimizer["state"].items():
        for name, value in entry.items():
            assert torch.equal(state["state"][key][name], value)
    assert scheduler2.state_dict() == expected_scheduler
    assert acc.step == 3

    # A damaged old checkpoint is still refused.
    with open(os.path.join(folder, "optimizer.bin"), "r+b") as f:
        f.seek(100)
        byte = f.read(1)
        f.seek(100)
        f.write(bytes([byte[0] ^ 0xFF]))
    from cadence.checkpointing import CheckpointCorruptError

    with pytest.raises(CheckpointCorruptError, match="optimizer.bin"):
        acc.load_state(folder)


def test_fast_safetensors_writer_is_read_by_the_safetensors_package(tmp_path):
    from safetensors.torch import load_file

    from cadence.checkpointing import begin_checkpoint, open_checkpoint

    base = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    tensors = {
        "f32": base,
        "transposed": base.t(),  # not contiguous
        "bf16": torch.randn(5, dtype=torch.bfloat16),
        "f16": torch.randn(3, 2).half(),
        "i64": torch.arange(7),
        "i8": torch.arange(5, dtype=torch.int8),
        "mask": torch.tensor([True, False, True]),  # 3 bytes before 8-byte items would misalign
        "scalar": torch.tensor(2.5, dtype=torch.float64),
        "empty": torch.empty(0, 3),
    }
    writer = begin_checkpoint(tmp_path / "c", durable=False)
    writer.save_tensors("w.safetensors", tensors)
    writer.commit()
    theirs = load_file(str(tmp_path / "c" / "w.safetensors"))
    with open_checkpoint(tmp_path / "c") as reader:
        ours = reader.load_tensors("w.safetensors")
    for name, tensor in tensors.items():
        for loaded in (theirs[name], ours[name]):
            assert loaded.dtype == tensor.dtype and loaded.shape == tensor.shape
            assert torch.equal(loaded, tensor)
    ours["f32"].add_(1)  # loaded tensors are writable and private: the file does not change
    with open_checkpoint(tmp_path / "c") as reader:
        assert torch.equal(reader.load_tensors("w.safetensors")["f32"], base)
