"""Several ranks of a machine load one checkpoint: each byte is checksummed once per machine, a
damaged file in any rank's share is refused on every rank before anything is applied, and a rank
that dies during the shared verification stops the others with a clear error (real gloo
processes, issue 46)."""

from __future__ import annotations

import functools
import multiprocessing as mp
import os
import queue
import random

import pytest
import torch

from harness import free_port


def build(folder=None):
    from cadence import Accelerator

    torch.manual_seed(0)
    acc = Accelerator(cpu=True)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Linear(64, 8))
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2)
    model, optimizer, scheduler = acc.prepare(model, optimizer, scheduler)
    model(torch.randn(4, 64)).sum().backward()
    optimizer.step()
    scheduler.step()
    return acc, model


def save(folder):
    acc, _ = build()
    acc.save_state(folder)
    return sorted(os.listdir(folder))


def load_and_count(folder, **load_kwargs):
    """Load `folder` (with `load_kwargs`); what this rank hashed and whether its weights are the
    saved ones."""
    from cadence.checkpointing import hashed_bytes

    acc, model = build()
    saved = {k: v.clone() for k, v in acc.unwrap_model(model).state_dict().items()}
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
    before = hashed_bytes()
    acc.load_state(folder, **load_kwargs)
    restored = acc.unwrap_model(model).state_dict()
    return hashed_bytes() - before, all(torch.equal(saved[k], restored[k]) for k in saved)


def load_refused(folder):
    """Load a damaged `folder`: the error, and whether the model is untouched."""
    acc, model = build()
    with torch.no_grad():
        for p in model.parameters():
            p.fill_(0.5)
    try:
        acc.load_state(folder)
    except Exception as e:  # what every rank must raise
        error = (type(e).__name__, str(e))
    else:
        error = None
    untouched = all(bool((p == 0.5).all()) for p in model.parameters())
    return error, untouched


def _needed_bytes(folder, world):
    names = ["model.safetensors", "optimizer.bin", "scheduler.bin"]
    names += [f"random_states_{r}.pkl" for r in range(world)]
    return sum(os.path.getsize(os.path.join(folder, n)) for n in names)


@pytest.mark.parametrize("world", [2, 3])
def test_each_byte_is_hashed_once_per_machine(dist_pool, tmp_path, world):
    folder = str(tmp_path / "ckpt")
    dist_pool(world).run(save, folder)
    results = dist_pool(world).run(load_and_count, folder)
    assert all(restored for _, restored in results)
    hashed = [count for count, _ in results]
    # Every byte the machine loads is hashed by exactly one rank, and the work is split.
    assert sum(hashed) == _needed_bytes(folder, world)
    assert all(0 < count < sum(hashed) for count in hashed)


def load_own_copy(folders):
    import torch.distributed as dist

    return load_and_count(folders[dist.get_rank()])


def test_ranks_loading_separate_copies_verify_each_their_own(dist_pool, tmp_path):
    # Same file names, different files (each rank its own copy): no rank relies on another's check.
    import shutil

    folder = str(tmp_path / "ckpt")
    dist_pool(2).run(save, folder)
    copy = str(tmp_path / "copy")
    shutil.copytree(folder, copy)
    results = dist_pool(2).run(load_own_copy, [folder, copy])
    assert all(restored for _, restored in results)
    needed = _needed_bytes(folder, 2)
    other = [os.path.getsize(os.path.join(folder, f"random_states_{1 - r}.pkl")) for r in range(2)]
    # each rank hashed the shared files and its own RNG state, not the other's
    assert [count for count, _ in results] == [needed - other[r] for r in range(2)]


def test_one_process_hashes_everything_it_loads(dist_pool, tmp_path):
    folder = str(tmp_path / "ckpt")
    dist_pool(1).run(save, folder)
    [(hashed, restored)] = dist_pool(1).run(load_and_count, folder)
    assert restored and hashed == _needed_bytes(folder, 1)


def _flip_byte(path):
    with open(path, "r+b") as f:
        f.seek(os.path.getsize(path) // 2)
        byte = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte[0] ^ 0xFF]))


@pytest.mark.parametrize(
    "damaged",
    [
        "model.safetensors",
        "optimizer.bin",
        "scheduler.bin",
        "random_states_0.pkl",
        "random_states_1.pkl",
    ],
)
def test_a_damaged_file_in_any_share_is_refused_on_every_rank(dist_pool, tmp_path, damaged):
    # Each file is in one rank's share (each rank's own RNG state in its own): every share is hit.
    folder = str(tmp_path / "ckpt")
    dist_pool(2).run(save, folder)
    _flip_byte(os.path.join(folder, damaged))
    for rank, (error, untouched) in enumerate(dist_pool(2).run(load_refused, folder)):
        assert error is not None and error[0] == "CheckpointCorruptError", (rank, error)
        assert damaged in error[1] and "nothing of it was applied" in error[1]
        assert untouched, f"rank {rank} applied part of a damaged checkpoint"


def load_with_a_failing_share(folder):
    """Rank 1 cannot read its share (an I/O error while hashing): every rank refuses the load."""
    import torch.distributed as dist

    from cadence.checkpointing import node_verify

    def unreadable(self, *args):
        raise OSError(5, "Input/output error")

    original = node_verify.MappedFile.hash
    if dist.get_rank() == 1:
        node_verify.MappedFile.hash = unreadable
    try:
        return load_refused(folder)
    finally:
        node_verify.MappedFile.hash = original


def test_a_rank_failing_in_its_share_stops_every_rank(dist_pool, tmp_path):
    folder = str(tmp_path / "ckpt")
    dist_pool(2).run(save, folder)
    for rank, (error, untouched) in enumerate(dist_pool(2).run(load_with_a_failing_share, folder)):
        assert error is not None and error[0] == "CheckpointCorruptError", (rank, error)
        assert "process 1 could not verify its share" in error[1] and "Input/output" in error[1]
        assert untouched


def test_assign_shares_splits_each_machine_on_its_own():
    from cadence.checkpointing.node_verify import Need, assign_shares

    # an old checkpoint (whole-file checksums): files are the units
    shared = {"model.safetensors": 400, "optimizer.bin": 800, "scheduler.bin": 1}
    needs = [
        Need(rank, node, {**shared, f"random_states_{rank}.pkl": 10})
        for rank, node in enumerate(["a", "a", "b", "b"])
    ]
    shares = assign_shares(needs)
    for node_ranks in ([0, 1], [2, 3]):
        names = [u[0] for r in node_ranks for u in shares[r]]
        assert sorted(names) == sorted(
            [*shared, *(f"random_states_{r}.pkl" for r in node_ranks)]
        )  # every file of the machine once, by one of its ranks
    assert shares[0] == [("optimizer.bin", 0, 800), ("random_states_0.pkl", 0, 10)]
    assert shares[1] == [
        ("model.safetensors", 0, 400),
        ("random_states_1.pkl", 0, 10),
        ("scheduler.bin", 0, 1),
    ]
    assert assign_shares(reversed(needs)) == shares  # the same on every rank


def test_assign_shares_balances_pieces():
    # checksums of pieces (100-byte pieces here): the ranks split the pieces, not the files
    from cadence.checkpointing.node_verify import Need, assign_shares

    shared = {"model.safetensors": 400, "optimizer.bin": 800, "scheduler.bin": 1}
    pieces = {"model.safetensors": 100, "optimizer.bin": 100}
    for world in (2, 3, 4):
        needs = [
            Need(r, "a", {**shared, f"random_states_{r}.pkl": 10}, pieces) for r in range(world)
        ]
        shares = assign_shares(needs)
        loads = [sum(stop - start for _, start, stop in shares[r]) for r in range(world)]
        assert sum(loads) == 1201 + 10 * world and max(loads) - min(loads) <= 100, loads
        units = sorted(u for r in range(world) for u in shares[r])
        assert [u for u in units if u[0] == "optimizer.bin"] == [
            ("optimizer.bin", a, a + 100) for a in range(0, 800, 100)
        ]
        assert assign_shares(reversed(needs)) == shares


def _dying_rank(rank, world, port, folder, results, victim, moment):
    """One rank of a load in which rank `victim` dies (exit code 3) at its `moment`-th checksum of
    a unit of its share, or at the exchange of digests when it has fewer units (moment 0: there)."""
    os.environ.update(
        RANK=str(rank),
        WORLD_SIZE=str(world),
        LOCAL_RANK=str(rank),
        LOCAL_WORLD_SIZE=str(world),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        CUDA_VISIBLE_DEVICES="",
    )
    from cadence.checkpointing import node_verify

    acc, _ = build()
    if rank == victim:
        calls = [0]
        hash_unit, exchange = node_verify.MappedFile.hash, node_verify._exchange

        def hash_or_die(self, *args, **kwargs):
            calls[0] += 1
            if calls[0] == moment:
                os._exit(3)  # killed in the middle of its share of the checksums
            return hash_unit(self, *args, **kwargs)

        def die_before_exchanging(agree, mine, rank, path, what):
            if what.startswith("the exchange of the checksums"):
                os._exit(3)  # its share hashed, killed before it reports it
            return exchange(agree, mine, rank, path, what)

        node_verify.MappedFile.hash = hash_or_die
        node_verify._exchange = die_before_exchanging
    try:
        acc.load_state(folder)
    except Exception as e:
        results.put((rank, type(e).__name__, str(e)))
    else:
        results.put((rank, None, "loaded"))
    results.close()
    results.join_thread()  # delivered before the hard exit below
    os._exit(0)


# Seeds chosen to cover each rank of 3 and each moment: 0 (3 ranks, rank 1, the exchange),
# 5 (3 ranks, rank 2, its first checksum), 12 (3 ranks, rank 1, its second), 15 (2 ranks, rank 0,
# its second), 20 (2 ranks, rank 1, its second).
@pytest.mark.parametrize("seed", [0, 5, 12, 15, 20])
def test_a_rank_dying_during_the_shared_verification_stops_the_others(tmp_path, dist_pool, seed):
    # The moment is drawn: which rank of 2 or 3 dies, at which checksum of its share or at the
    # exchange of the digests. Every survivor raises, names itself and applies nothing; none hangs.
    draw = random.Random(seed)
    world = draw.choice([2, 3])
    victim = draw.randrange(world)
    moment = draw.choice([0, 1, 2])
    print(f"seed {seed}: {world} ranks, rank {victim} dies at checksum {moment or 'exchange'}")
    folder = str(tmp_path / "ckpt")
    dist_pool(world).run(save, folder)
    context = mp.get_context("spawn")
    results = context.Queue()
    port = free_port()
    processes = [
        context.Process(
            target=_dying_rank, args=(rank, world, port, folder, results, victim, moment)
        )
        for rank in range(world)
    ]
    for process in processes:
        process.start()
    outcomes = {}
    try:
        for _ in range(world - 1):
            rank, kind, message = results.get(timeout=240)  # bounded: survivors do not hang
            outcomes[rank] = (kind, message)
    except queue.Empty:
        pytest.fail(f"survivors neither loaded nor raised: only {sorted(outcomes)} answered")
    finally:
        for process in processes:
            process.join(timeout=30)
            if process.is_alive():
                process.kill()
    assert processes[victim].exitcode == 3
    assert sorted(outcomes) == [r for r in range(world) if r != victim]
    for rank, (kind, message) in outcomes.items():
        assert kind == "SharedVerificationError", (rank, kind, message)
        assert f"Process {rank}" in message and "nothing of the checkpoint was applied" in message


# ---------------------------------------------------------------- checksums of pieces (issue 46)
PIECE = 1 << 20  # the tests' piece size (new checkpoints: 64 MiB)


def _with_checksum(algorithm, fn, *args):
    """Run `fn` with `algorithm` as the checksum of new checkpoints (in this worker process)."""
    from cadence.checkpointing import manifest

    original = manifest._default_checksum
    manifest._default_checksum = lambda installed: algorithm
    try:
        return fn(*args)
    finally:
        manifest._default_checksum = original


def build_wide(width=512):
    """A model whose files span several 1 MiB pieces: 2.1 MB of weights, 4.2 MB of AdamW state."""
    from cadence import Accelerator

    torch.manual_seed(0)
    acc = Accelerator(cpu=True)
    model = torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.Linear(width, width))
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
    model, optimizer = acc.prepare(model, optimizer)
    model(torch.randn(4, width)).sum().backward()
    optimizer.step()
    return acc, model


def save_wide(folder, algorithm):
    acc, _ = build_wide()
    _with_checksum(algorithm, acc.save_state, folder)


def load_wide(folder):
    """Load `folder` into a zeroed model: (bytes hashed, restored, error, untouched if it failed)."""
    from cadence.checkpointing import hashed_bytes

    acc, model = build_wide()
    saved = {k: v.clone() for k, v in acc.unwrap_model(model).state_dict().items()}
    with torch.no_grad():
        for p in model.parameters():
            p.fill_(0.5)
    before = hashed_bytes()
    try:
        acc.load_state(folder)
    except Exception as e:
        untouched = all(bool((p == 0.5).all()) for p in model.parameters())
        return hashed_bytes() - before, False, (type(e).__name__, str(e)), untouched
    restored = acc.unwrap_model(model).state_dict()
    same = all(torch.equal(saved[k], restored[k]) for k in saved)
    return hashed_bytes() - before, same, None, False


def _wide_needed(folder, world):
    names = ["model.safetensors", "optimizer.bin"] + [
        f"random_states_{r}.pkl" for r in range(world)
    ]
    return sum(os.path.getsize(os.path.join(folder, n)) for n in names)


def _manifest(folder):
    import json

    with open(os.path.join(folder, "cadence_manifest.json")) as f:
        return json.load(f)


@pytest.mark.parametrize("world", [2, 3])
def test_pieces_are_hashed_once_and_split_evenly(dist_pool, tmp_path, world):
    folder = str(tmp_path / "ckpt")
    dist_pool(world).run(save_wide, folder, "xxh3_128-pieces-1MiB")
    assert _manifest(folder)["checksum_algorithm"] == "xxh3_128-pieces-1MiB"
    assert os.path.getsize(os.path.join(folder, "optimizer.bin")) > 4 * PIECE
    results = dist_pool(world).run(load_wide, folder)
    assert all(restored and error is None for _, restored, error, _ in results), results
    hashed = [count for count, *_ in results]
    total = _wide_needed(folder, world)
    assert sum(hashed) == total  # every byte once on this machine
    assert all(abs(count - total / world) <= PIECE for count in hashed), hashed  # even


def _share_pieces(folder, world):
    """{rank: [(file, start, stop)]}: the pieces of the shared files each rank hashes."""
    from cadence.checkpointing.node_verify import Need, assign_shares

    shared = {
        n: os.path.getsize(os.path.join(folder, n)) for n in ("model.safetensors", "optimizer.bin")
    }
    needs = [
        Need(
            r,
            "node",
            {
                **shared,
                f"random_states_{r}.pkl": os.path.getsize(
                    os.path.join(folder, f"random_states_{r}.pkl")
                ),
            },
            {n: PIECE for n in shared},
        )
        for r in range(world)
    ]
    return {r: [u for u in units if u[0] in shared] for r, units in assign_shares(needs).items()}


@pytest.mark.parametrize("share_of", [0, 1])
def test_a_damaged_piece_in_either_share_is_refused_on_every_rank(dist_pool, tmp_path, share_of):
    folder = str(tmp_path / "ckpt")
    dist_pool(2).run(save_wide, folder, "xxh3_128-pieces-1MiB")
    shares = _share_pieces(folder, 2)
    name, start, stop = shares[share_of][-1]  # a piece only rank `share_of` hashes
    assert all((name, start, stop) not in units for r, units in shares.items() if r != share_of)
    _flip_byte_at(os.path.join(folder, name), (start + stop) // 2)
    for rank, (_, restored, error, untouched) in enumerate(dist_pool(2).run(load_wide, folder)):
        assert error is not None and error[0] == "CheckpointCorruptError", (rank, error)
        assert name in error[1] and "nothing of it was applied" in error[1]
        assert untouched and not restored, f"rank {rank} applied part of a damaged checkpoint"


def test_a_truncated_file_is_refused_on_every_rank(dist_pool, tmp_path):
    folder = str(tmp_path / "ckpt")
    dist_pool(2).run(save_wide, folder, "xxh3_128-pieces-1MiB")
    path = os.path.join(folder, "optimizer.bin")
    os.truncate(path, os.path.getsize(path) - 1)
    for rank, (_, restored, error, untouched) in enumerate(dist_pool(2).run(load_wide, folder)):
        assert error is not None and "optimizer.bin" in error[1], (rank, error)
        assert untouched and not restored


def test_a_checkpoint_with_whole_file_checksums_still_loads_on_several_ranks(dist_pool, tmp_path):
    # checkpoints saved before issue 46 record one checksum per file: each file is one rank's
    folder = str(tmp_path / "ckpt")
    dist_pool(2).run(save_wide, folder, "xxh3_128")
    manifest = _manifest(folder)
    assert manifest["checksum_algorithm"] == "xxh3_128" and "pieces" not in str(manifest)
    results = dist_pool(2).run(load_wide, folder)
    assert all(restored and error is None for _, restored, error, _ in results), results
    assert sum(count for count, *_ in results) == _wide_needed(folder, 2)
    _flip_byte_at(os.path.join(folder, "model.safetensors"), 1000)
    for rank, (_, _, error, untouched) in enumerate(dist_pool(2).run(load_wide, folder)):
        assert error is not None and error[0] == "CheckpointCorruptError", (rank, error)
        assert "model.safetensors" in error[1] and untouched


def _flip_byte_at(path, offset):
    with open(path, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)
        f.seek(offset)
        f.write(bytes([byte[0] ^ 0xFF]))


def verify_one_folder(folder, names):
    """Verify `names` of `folder` together with the other ranks: (bytes hashed, error or None)."""
    import torch.distributed as dist

    from cadence.checkpointing import hashed_bytes, open_checkpoint

    world = dist.get_world_size() if dist.is_initialized() else 1

    def agree(mine):
        if world == 1:
            return list(mine)
        out = [None] * world
        dist.all_gather_object(out, mine[0])
        return out

    rank = dist.get_rank() if world > 1 else 0
    before = hashed_bytes()
    try:
        with open_checkpoint(folder) as reader:
            reader.verify_together(names, rank, agree)
    except Exception as e:
        return hashed_bytes() - before, (type(e).__name__, str(e))
    return hashed_bytes() - before, None


@pytest.mark.parametrize("world", [1, 2, 3])
@pytest.mark.parametrize("size", [PIECE - 1, PIECE, PIECE + 1, 3 * PIECE + 1])
def test_piece_boundaries_on_any_number_of_ranks(dist_pool, tmp_path, world, size):
    from cadence.checkpointing import begin_checkpoint

    folder = tmp_path / "ckpt"
    writer = begin_checkpoint(folder, checksum="xxh3_128-pieces-1MiB", durable=False)
    data = os.urandom(size)
    writer.save_bytes("data.bin", data)
    writer.save_bytes("small.bin", b"x" * 100)
    writer.commit()
    names = ["data.bin", "small.bin"]
    results = dist_pool(world).run(verify_one_folder, str(folder), names)
    assert all(error is None for _, error in results), results
    hashed = [count for count, _ in results]
    total = size + 100
    assert sum(hashed) == total and all(abs(c - total / world) <= PIECE for c in hashed), hashed
    # a changed byte in the first piece, then in the last: refused on every rank
    for offset in (0, size - 1):
        _flip_byte_at(folder / "data.bin", offset)
        for rank, (_, error) in enumerate(
            dist_pool(world).run(verify_one_folder, str(folder), names)
        ):
            assert error is not None and error[0] == "CheckpointCorruptError", (rank, offset, error)
            assert "data.bin" in error[1] and "content changed since the save" in error[1]
        _flip_byte_at(folder / "data.bin", offset)  # back as saved
    assert all(e is None for _, e in dist_pool(world).run(verify_one_folder, str(folder), names))


# ------------------------------------------------ a folder Accelerate wrote (no manifest to share)
def load_unverified_one_rank_missing(folder, missing_rank):
    """Load `folder` with allow_unverified, except rank `missing_rank`, which is given a folder
    that does not exist: the error of this rank, and whether its model is untouched."""
    acc, model = build()
    with torch.no_grad():
        for p in model.parameters():
            p.fill_(0.5)
    mine = folder + "_missing" if acc.process_index == missing_rank else folder
    try:
        acc.load_state(mine, allow_unverified=True)
    except Exception as e:
        error = (type(e).__name__, str(e))
    else:
        error = None
    return error, all(bool((p == 0.5).all()) for p in model.parameters())


@pytest.mark.parametrize("world", [2, 3])
def test_a_folder_without_manifest_loads_on_every_rank_when_asked_to(dist_pool, tmp_path, world):
    # As Accelerate writes it (no Cadence records): nothing to verify, but the ranks still meet in
    # the exchange, so a rank that cannot open its folder stops the others (none applies, none
    # hangs); otherwise every rank reads its files and ends with the saved weights.
    folder = str(tmp_path / "ckpt")
    dist_pool(world).run(save, folder)
    for name in os.listdir(folder):
        if name.startswith("cadence_") or name.startswith("dl_state_dict"):
            os.remove(os.path.join(folder, name))
    refused = dist_pool(world).run(load_refused, folder)
    assert all(
        error and "allow_unverified" in error[1] and untouched for error, untouched in refused
    )
    missing_rank = world - 1 if world == 2 else 0
    failed = dist_pool(world).run(load_unverified_one_rank_missing, folder, missing_rank)
    for rank, (error, untouched) in enumerate(failed):
        assert untouched, rank
        if rank == missing_rank:
            assert error and error[0] == "CheckpointIncompleteError" and "Tried to find" in error[1]
        else:  # told by the exchange which rank could not load what
            assert error and error[0] == "CheckpointError", (rank, error)
            assert "_missing but folder does not exist" in error[1]
            assert "Nothing of it was applied" in error[1]
    loaded = dist_pool(world).run(functools.partial(load_and_count, allow_unverified=True), folder)
    for hashed, same in loaded:
        assert same and hashed == 0
