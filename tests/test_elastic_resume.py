"""Resume on another number of processes (issue 24): the global data position, RNG for new ranks.

In-process part: prepared loaders built for each rank of N and M processes (as each process of a
launch builds its own), the epoch's position saved on N and loaded on M. Multi-process part
(test_elastic_checkpoint.py): whole checkpoints through real launches.
"""

from __future__ import annotations

import io

import pytest
import torch
from torch.utils.data import DataLoader

from cadence.checkpointing.elastic_state import derive_rng_state, derived_seed
from cadence.checkpointing.serialization import capture_rng_state
from cadence.data import prepare_data_loader

SIZE, BATCH = 112, 4  # 16 samples seen after 2 steps on 2 processes; 96 left, a multiple of 4*M


def build(num_processes: int, rank: int, size: int = SIZE, **options):
    torch.manual_seed(0)  # the script's set_seed: every process draws the same generators
    loader = DataLoader(range(size), batch_size=BATCH, shuffle=True)
    return prepare_data_loader(
        loader, num_processes=num_processes, process_index=rank, rng_types=["generator"], **options
    )


def through_file(state):
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=True)


def global_order(per_rank: list[list[list[int]]]) -> list[int]:
    """The epoch's samples in the order the source batches were drawn (round by round)."""
    order = []
    for batches in zip(*per_rank):
        for batch in batches:
            order += batch
    return order


def run_epochs(loaders, epochs: int, start_states=None):
    """Every rank's batches of `epochs` epochs (lists of sample ids), per epoch."""
    if start_states is not None:
        for loader, state in zip(loaders, start_states):
            loader.load_state_dict(state)
    return [[[b.tolist() for b in loader] for loader in loaders] for _ in range(epochs)]


def saved_after(steps: int, num_processes: int = 2, **options):
    """(samples each rank saw, position state of each rank) after `steps` steps of epoch 0."""
    loaders = [build(num_processes, r, **options) for r in range(num_processes)]
    iterators = [iter(loader) for loader in loaders]
    seen = [[next(it).tolist() for _ in range(steps)] for it in iterators]
    states = [through_file(loader.state_dict()) for loader in loaders]
    return seen, states


@pytest.mark.parametrize("new_world", [1, 2, 3, 4])
def test_epoch_continues_with_the_unseen_samples_on_any_number_of_processes(new_world):
    uninterrupted = run_epochs([build(2, r) for r in range(2)], epochs=2)
    seen, states = saved_after(steps=2)
    assert states[0]["global"]["samples"] == 2 * 2 * BATCH
    loaders = [build(new_world, r) for r in range(new_world)]
    # A new rank (beyond the saved ones) loads rank 0's state, as load_state gives it.
    resumed = run_epochs(loaders, 2, [states[min(r, 1)] for r in range(new_world)])
    before = [s for rank in seen for batch in rank for s in batch]
    after = [s for rank in resumed[0] for batch in rank for s in batch]
    assert sorted(before + after) == list(range(SIZE))  # each sample of the epoch exactly once
    # The rest of the epoch in the saved order, then the epoch the run would have had next.
    assert global_order(resumed[0]) == global_order(uninterrupted[0])[len(before) :]
    # (on 3 processes a whole epoch of 28 batches ends with a padded round, as even_batches does)
    assert global_order(resumed[1])[:SIZE] == global_order(uninterrupted[1])
    assert all(len(batch) == BATCH for rank in resumed[0] for batch in rank)


@pytest.mark.parametrize(
    "size, steps, new_world, split",
    [(112, 1, 3, False), (110, 1, 3, False), (110, 3, 4, True)],
    ids=["full-last-batch", "short-last-batch", "split-batches"],
)
def test_padding_of_a_resumed_epoch_repeats_the_epochs_first_samples(size, steps, new_world, split):
    # even_batches pads an epoch's last round with the first samples of the epoch's order; an epoch
    # resumed on another number of processes follows the same rule (not the start of what was left).
    options = {"size": size, "split_batches": split}
    uninterrupted = run_epochs([build(2, r, **options) for r in range(2)], epochs=1)
    order = global_order(uninterrupted[0])[:size]  # the epoch's order (then 2 padding samples)
    assert sorted(order) == list(range(size))
    seen, states = saved_after(steps=steps, **options)
    consumed = steps * (BATCH if split else 2 * BATCH)
    loaders = [build(new_world, r, **options) for r in range(new_world)]
    resumed = global_order(run_epochs(loaders, 1, [states[min(r, 1)] for r in range(new_world)])[0])
    per_step = BATCH if split else new_world * BATCH
    padded = -(-(size - consumed) // per_step) * per_step
    assert padded > size - consumed  # this case pads
    assert resumed[: size - consumed] == order[consumed:]
    assert resumed[size - consumed :] == order[: padded - (size - consumed)]
    # The same rule as an epoch that starts on the new number of processes.
    fresh = global_order(
        run_epochs([build(new_world, r, **options) for r in range(new_world)], 1)[0]
    )
    assert fresh[size:] == order[: len(fresh) - size]


def test_position_resaved_after_a_world_size_change_resumes_again():
    seen, states = saved_after(steps=2)  # 16 samples on 2 processes
    three = [build(3, r) for r in range(3)]
    for loader, state in zip(three, [states[0], states[1], states[0]]):
        loader.load_state_dict(state)
    iterators = [iter(loader) for loader in three]
    more = [next(it).tolist() for it in iterators]  # 12 more samples on 3 processes
    again = [through_file(loader.state_dict()) for loader in three]
    assert again[0]["global"]["samples"] == 16 + 12
    one = build(1, 0)
    one.load_state_dict(again[0])
    rest = [b.tolist() for b in one]
    everything = [s for r in seen for b in r for s in b] + [s for b in more for s in b]
    everything += [s for b in rest for s in b]
    assert sorted(everything) == list(range(SIZE))


def test_split_batches_position_is_counted_in_samples():
    seen, states = saved_after(steps=3, split_batches=True)  # 3 global batches of 4
    assert states[0]["global"]["samples"] == 3 * BATCH
    loaders = [build(4, r, split_batches=True) for r in range(4)]
    resumed = run_epochs(loaders, 1, [states[0]] * 4)
    before = [s for r in seen for b in r for s in b]
    after = [s for r in resumed[0] for b in r for s in b]
    assert sorted(before + after) == list(range(SIZE))


def test_a_position_that_is_no_whole_number_of_new_batches_is_refused():
    seen, states = saved_after(steps=1, num_processes=3)  # 12 samples
    torch.manual_seed(0)
    loader = prepare_data_loader(
        DataLoader(range(SIZE), batch_size=8, shuffle=True), num_processes=2, process_index=0
    )
    with pytest.raises(ValueError, match="12 samples"):
        loader.load_state_dict(states[0])


def test_new_ranks_get_a_documented_rng_derivation():
    torch.manual_seed(123)
    rank0 = through_file(capture_rng_state(step=7))
    derived = derive_rng_state(rank0, 3)
    assert derived["step"] == 7
    expected = torch.Generator().manual_seed(derived_seed(rank0, 3)).get_state()
    assert torch.equal(derived["torch_manual_seed"], expected)
    assert not torch.equal(
        derived["torch_manual_seed"], derive_rng_state(rank0, 4)["torch_manual_seed"]
    )
    assert torch.equal(
        derived["torch_manual_seed"], derive_rng_state(rank0, 3)["torch_manual_seed"]
    )


def _old_two_process_checkpoint(folder, loader_state):
    """A checkpoint as Cadence wrote them before positions were global: one manifest for 2 ranks,
    per-rank dataloader positions without their global count (written file by file)."""
    import hashlib
    import json
    import os

    os.makedirs(folder)
    for rank in range(2):
        torch.save(capture_rng_state(step=2), os.path.join(folder, f"random_states_{rank}.pkl"))
        torch.save(loader_state, os.path.join(folder, f"dl_state_dict_rank{rank}.bin"))
    files = {}
    for name in sorted(os.listdir(folder)):
        data = open(os.path.join(folder, name), "rb").read()
        files[name] = {"size": len(data), "checksum": hashlib.sha256(data).hexdigest()}
    manifest = {
        "format": "cadence-checkpoint",
        "format_version": 1,
        "created": 0.0,
        "world_size": 2,
        "ranks": [0, 1],
        "checksum_algorithm": "sha256",
        "metadata": {},
        "files": files,
    }
    with open(os.path.join(folder, "cadence_manifest.json"), "w") as f:
        json.dump(manifest, f)


def test_an_older_checkpoint_resumes_only_on_the_number_of_processes_that_saved_it(tmp_path):
    from cadence.checkpointing import CheckpointMismatchError
    from cadence.checkpointing.state_io import StateTargets, read_training_state

    _, states = saved_after(steps=2)
    old = {k: v for k, v in states[0].items() if k != "global"}
    folder = tmp_path / "old"
    _old_two_process_checkpoint(folder, old)
    same = read_training_state(folder, StateTargets(loaders={0: build(2, 1)}, rank=1, world_size=2))
    assert same.loaders[0]["batches_yielded"] == 2 and same.saved_world_size == 2
    with pytest.raises(CheckpointMismatchError, match="resumes only on 2 processes"):
        read_training_state(folder, StateTargets(loaders={0: build(1, 0)}, rank=0, world_size=1))


def test_stateful_loader_position_from_save_state_continues_on_another_number():
    pytest.importorskip("torchdata")  # an optional package: skipped cleanly without it
    loaders = [build(2, r, use_stateful_dataloader=True) for r in range(2)]
    iterators = [iter(loader) for loader in loaders]
    seen = [next(it).tolist() for it in iterators for _ in range(1)]
    seen += [next(it).tolist() for it in iterators]
    state = through_file(loaders[0].checkpoint_state_dict())  # what save_state writes
    three = [build(3, r, use_stateful_dataloader=True) for r in range(3)]
    for loader in three:
        loader.load_state_dict(state)
    rest = [b.tolist() for loader in three for b in loader]
    everything = [s for b in seen for s in b] + [s for b in rest for s in b]
    assert sorted(everything) == list(range(SIZE))


def test_dispatching_loader_refuses_another_number_of_processes():
    _, states = saved_after(steps=2)
    torch.manual_seed(0)
    loader = prepare_data_loader(
        DataLoader(range(SIZE), batch_size=BATCH, shuffle=True),
        dispatch_batches=True,
        put_on_device=True,
        device=torch.device("cpu"),
    )
    with pytest.raises(ValueError, match="only resume on the number of processes that saved it"):
        loader.load_state_dict(states[0])
