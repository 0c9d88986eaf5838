"""Where a verified load puts the checkpoint's bytes (issue 24, items 5 and 6), for files large
enough to be hashed by a second thread while they are read: the state loaded is exactly the saved one and lives in
anonymous memory (no file mapping); a damaged large file changes nothing; `open_file` hands over
exactly the bytes that were verified."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch

from cadence import Accelerator
from cadence.checkpointing import CheckpointCorruptError, open_checkpoint

WIDTH = 1536  # 9 MiB of weights, 18 MiB of AdamW state (hashed in 8 MiB chunks while read)


def _job(value: float):
    """A prepared model and AdamW whose weights and state are all `value` (after one real step)."""
    accelerator = Accelerator(cpu=True)
    model = torch.nn.Linear(WIDTH, WIDTH)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model, optimizer = accelerator.prepare(model, optimizer)
    model(torch.randn(2, WIDTH)).sum().backward()
    optimizer.step()
    optimizer.zero_grad()
    with torch.no_grad():
        for p in model.parameters():
            p.fill_(value)
        for state in optimizer.state.values():
            state["exp_avg"].fill_(value)
            state["exp_avg_sq"].fill_(value * value)
    return accelerator, model, optimizer


def _snapshot(model, optimizer):
    weights = {k: v.clone() for k, v in model.state_dict().items()}
    state = {
        (k, n): t.clone()
        for k, s in optimizer.state_dict()["state"].items()
        for n, t in s.items()
        if isinstance(t, torch.Tensor)
    }
    return weights, state


def _same(a, b) -> bool:
    return all(
        a[i].keys() == b[i].keys() and all(torch.equal(a[i][k], b[i][k]) for k in a[i])
        for i in range(2)
    )


def _mapping_of(address: int) -> str:
    """The /proc/self/maps line whose range holds `address`."""
    with open("/proc/self/maps") as f:
        for line in f:
            start, end = (int(x, 16) for x in line.split()[0].split("-"))
            if start <= address < end:
                return line.strip()
    raise AssertionError(f"address {address:#x} is in no mapping")


@pytest.fixture
def saved(tmp_path):
    accelerator, model, optimizer = _job(1.5)
    folder = Path(accelerator.save_state(tmp_path / "ckpt"))
    assert (folder / "optimizer.bin").stat().st_size > 16 << 20
    return folder, _snapshot(model, optimizer)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/maps")
def test_large_state_loads_exactly_into_anonymous_memory(saved):
    folder, expected = saved
    accelerator, model, optimizer = _job(-3.0)
    accelerator.load_state(folder)
    assert _same(_snapshot(model, optimizer), expected)
    for state in optimizer.state.values():
        for tensor in state.values():
            line = _mapping_of(tensor.data_ptr())
            # memory of no file (anonymous or the heap): inode 0, no path
            fields = line.split()
            assert fields[4] == "0" and (len(fields) == 5 or fields[5].startswith("[")), line
            assert str(folder) not in line
    # large state tensors do not share one block: each is freed on its own
    large = [t for s in optimizer.state.values() for t in s.values() if t.numel() >= 1 << 18]
    assert len(large) == 2  # exp_avg and exp_avg_sq of the weight (the bias's are small)
    assert len({t.untyped_storage().data_ptr() for t in large}) == len(large)
    assert all(t.untyped_storage().nbytes() == t.numel() * t.element_size() for t in large)
    model(torch.randn(2, WIDTH)).sum().backward()
    optimizer.step()  # the loaded state is ordinary writable memory


@pytest.mark.parametrize("name", ["model.safetensors", "optimizer.bin"])
def test_damaged_large_file_changes_nothing(saved, name):
    folder, _ = saved
    path = folder / name
    with open(path, "r+b") as f:  # one byte in the middle of the tensors' data
        f.seek(path.stat().st_size // 2)
        byte = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte[0] ^ 0x01]))
    accelerator, model, optimizer = _job(-3.0)
    before = _snapshot(model, optimizer)
    with pytest.raises(CheckpointCorruptError, match=f"{name}: content changed since the save"):
        accelerator.load_state(folder)
    assert _same(_snapshot(model, optimizer), before)


def test_open_file_hands_over_the_verified_bytes(saved, tmp_path):
    folder, _ = saved
    original = (folder / "optimizer.bin").read_bytes()
    with open_checkpoint(folder) as reader:
        reader.prefetch(["optimizer.bin"])
        reader._prefetched["optimizer.bin"].result()  # read and verified: now the file changes
        with open(folder / "optimizer.bin", "r+b") as f:
            f.write(b"\0" * 4096)
        with reader.open_file("optimizer.bin") as f:
            assert f.seekable()
            assert f.read() == original
            f.seek(10)
            assert f.read(5) == original[10:15]
    # the same rewrite before the read is refused
    with open_checkpoint(folder) as reader, pytest.raises(CheckpointCorruptError, match="changed"):
        reader.open_file("optimizer.bin")


@pytest.mark.parametrize("readers", [1, 3])
def test_large_file_read_by_several_threads_is_verified_in_order(tmp_path, monkeypatch, readers):
    from cadence.checkpointing import safe_io

    monkeypatch.setattr(safe_io, "_READERS", readers)
    data = bytearray(os.urandom((72 << 20) + 4321))  # 9+ chunks: 3 readers take turns
    (tmp_path / "big.bin").write_bytes(data)
    size = len(data)
    checksum = safe_io.hash_member(tmp_path, "big.bin", size, "xxh3_128")
    buffer = safe_io.read_verified(tmp_path, "big.bin", size, checksum, "xxh3_128")
    assert bytes(buffer.numpy()) == data  # verified: the chunks were hashed in file order
    # bytes swapped between two chunks read by different threads: the same bytes, another order
    a, b = 5 << 20, 40 << 20
    data[a : a + 16], data[b : b + 16] = data[b : b + 16], data[a : a + 16]
    (tmp_path / "big.bin").write_bytes(data)
    with pytest.raises(CheckpointCorruptError, match="big.bin: content changed since the save"):
        safe_io.read_verified(tmp_path, "big.bin", size, checksum, "xxh3_128")


def test_segmented_file_reads_and_cuts_like_one_buffer(tmp_path):
    from cadence.checkpointing.torch_file import read_torch_file

    state = {"a": torch.arange(1 << 19, dtype=torch.float32), "b": torch.ones(3), "n": 7}
    torch.save(state, tmp_path / "s.bin")
    data = (tmp_path / "s.bin").read_bytes()
    file = read_torch_file(tmp_path, "s.bin", len(data), None, None)
    assert len(file.segments) == 3  # before the large record, the record, after it
    with file.open() as f:
        assert f.read() == data
        f.seek(len(data) - 10)
        assert f.read(100) == data[-10:]
    start, record = file.segments[1]
    assert file.storage()[start : start + record.numel()].data_ptr() == record.data_ptr()
    with pytest.raises(ValueError, match="span segments"):
        file.storage()[start - 1 : start + 1]
    (tmp_path / "plain.txt").write_bytes(b"not a zip file")  # read whole, as one segment
    assert len(read_torch_file(tmp_path, "plain.txt", 14, None, None).segments) == 1


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_pieces_read_by_turns_are_hashed_in_file_order(tmp_path, monkeypatch, threads):
    """piece_read: memory of its own for some ranges, none (read, hashed, dropped) for others;
    every byte hashed once, in file order, whichever thread read it."""
    import xxhash

    from cadence.checkpointing import piece_read

    monkeypatch.setattr(piece_read, "PIECE", 64 << 10)
    monkeypatch.setattr(piece_read, "PARALLEL_FROM", 0)
    monkeypatch.setattr(piece_read, "THREADS", threads)
    data = os.urandom((1 << 20) + 777)
    (tmp_path / "f.bin").write_bytes(data)
    bounds = [0, 100, 300_000, 300_001, 700_000, len(data)]  # kept, dropped, kept, kept, dropped
    kept = {0: bytearray(100), 300_000: bytearray(1), 300_001: bytearray(400_000 - 1)}
    ranges = [(b, memoryview(kept[b]) if b in kept else None) for b in bounds[:-1]]
    fd = os.open(tmp_path / "f.bin", os.O_RDONLY)
    try:
        hasher = xxhash.xxh3_128()
        assert piece_read.read_ranges_hashed(fd, ranges, len(data), hasher) == len(data)
        assert hasher.hexdigest() == xxhash.xxh3_128(data).hexdigest()
        assert all(bytes(kept[b]) == data[b : b + len(kept[b])] for b in kept)
        # the file ends before the ranges do: the bytes read are fewer, nothing after is hashed
        hasher = xxhash.xxh3_128()
        short = piece_read.read_ranges_hashed(fd, ranges, len(data) + (200 << 10), hasher)
        assert short == len(data)
        assert hasher.hexdigest() == xxhash.xxh3_128(data).hexdigest()
    finally:
        os.close(fd)
    with pytest.raises(ValueError, match="bytes of memory"):
        piece_read.read_ranges_hashed(0, [(0, memoryview(bytearray(3)))], 5, None)
