"""Accelerate's FSDP checkpoint functions (`save_fsdp_model`, `load_fsdp_model`, `save_fsdp_optimizer`,
`load_fsdp_optimizer`) on 2 real gloo processes, FSDP1 and FSDP2, sharded and full state dicts: they
write Accelerate's file layout, a fresh model and optimizer loaded from it continue exactly as the
saving run did, and `merge_fsdp_weights` / `cadence merge-weights` merge the sharded folder into the
whole model. Plus Accelerate's `test_merge_weights` scenario (FSDP1, size-based wrapping, save of a
twice-prepared model into a `Path`)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from sharded_helpers import (
    make_model,
    make_optimizer,
    max_difference,
    reference_training,
    train_by_index,
    train_with,
)

GLOBAL_BATCH = 16
# Both versions, both layouts; the full layout with the second model's numbers (`model_index=1`),
# the sharded one with the first (whose folder is then merged).
COMBINATIONS = [
    (version, state_dict_type, 0 if state_dict_type == "SHARDED_STATE_DICT" else 1)
    for version in (1, 2)
    for state_dict_type in ("SHARDED_STATE_DICT", "FULL_STATE_DICT")
]


def _accelerator(version, state_dict_type):
    from cadence import Accelerator
    from cadence.plugins import FullyShardedDataParallelPlugin

    plugin = FullyShardedDataParallelPlugin(
        fsdp_version=version,
        state_dict_type=state_dict_type,
        auto_wrap_policy="transformer_based_wrap",
        transformer_cls_names_to_wrap=["Block"],
    )
    return Accelerator(fsdp_plugin=plugin), plugin


def round_trip(directory, phase, version, state_dict_type, index):
    """phase "save": train 2 steps, save with the functions as Accelerate's save_state composes
    them (the FSDP model and optimizer, then the rest of the training state), train 2 more.
    phase "load": a fresh model (other weights), load, train the same 2 more steps."""
    from cadence.checkpointing import load_accelerator_state, save_accelerator_state
    from cadence.utils import (
        load_fsdp_model,
        load_fsdp_optimizer,
        save_fsdp_model,
        save_fsdp_optimizer,
    )

    acc, plugin = _accelerator(version, state_dict_type)
    model = make_model(seed=0 if phase == "save" else 99)
    optimizer = make_optimizer(model)
    model, optimizer = acc.prepare(model, optimizer)
    # gamma 1: the learning rate stays, the scheduler's count is the state that must come back
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer.optimizer, step_size=1, gamma=1.0)
    listing, restored = None, None
    if phase == "save":
        train_with(acc, model, optimizer, GLOBAL_BATCH, 2)
        scheduler.step(), scheduler.step()
        torch.manual_seed(100 + acc.process_index)  # a stream of each rank's own
        save_fsdp_model(plugin, acc, model, directory, model_index=index)
        save_fsdp_optimizer(plugin, acc, optimizer, model, directory, optimizer_index=index)
        save_accelerator_state(directory, [], [], [scheduler], [], acc.process_index, step=7)
        acc.wait_for_everyone()
        listing = sorted(os.listdir(directory))
    else:
        torch.manual_seed(1234)  # other random numbers than at save time
        load_fsdp_model(plugin, acc, model, directory, model_index=index)
        load_fsdp_optimizer(plugin, acc, optimizer, model, directory, optimizer_index=index)
        restored = load_accelerator_state(directory, [], [], [scheduler], [], acc.process_index)
    draw = torch.rand(3)  # continues the saved random stream after a load
    train_by_index(acc, model, optimizer, GLOBAL_BATCH, 2, 2, acc.process_index, acc.num_processes)
    state = acc.get_state_dict(model)
    extra = (listing, restored, scheduler.last_epoch, draw)
    return (state, *extra) if acc.is_main_process else (None, *extra)


def _expected_listing(state_dict_type, index):
    rest = ["scheduler.bin", "random_states_0.pkl", "random_states_1.pkl"]
    if state_dict_type == "SHARDED_STATE_DICT":  # torch.distributed.checkpoint folders
        return sorted([f"pytorch_model_fsdp_{index}", f"optimizer_{index}", *rest])
    suffix = "" if index == 0 else f"_{index}"
    return sorted([f"pytorch_model_fsdp{suffix}.bin", f"optimizer{suffix}.bin", *rest])


def _merge_checks(folder: Path, out: Path, expected: dict) -> None:
    """The sharded folder merges into the whole model: the function (both formats) and the CLI."""
    from safetensors.torch import load_file

    from cadence.utils import merge_fsdp_weights

    merge_fsdp_weights(str(folder), str(out / "function_safe"), safe_serialization=True)
    assert max_difference(load_file(out / "function_safe" / "model.safetensors"), expected) < 1e-6
    merge_fsdp_weights(str(folder), str(out / "function_bin"), safe_serialization=False)
    merged = torch.load(out / "function_bin" / "pytorch_model.bin", weights_only=True)
    assert max_difference(merged, expected) < 1e-6
    # The command (through a real subprocess); its --unsafe_serialization is Accelerate's scenario's.
    command = [sys.executable, "-m", "cadence.commands.cli", "merge-weights", str(folder)]
    done = subprocess.run(command + [str(out / "cli")], capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr
    assert max_difference(load_file(out / "cli" / "model.safetensors"), expected) < 1e-6


@pytest.mark.parametrize("version, state_dict_type, index", COMBINATIONS)
def test_the_functions_write_accelerates_layout_and_resume_exactly(
    dist_pool, tmp_path, version, state_dict_type, index
):
    pool = dist_pool(2)
    directory = str(tmp_path / "ckpt")
    saved = pool.run(round_trip, directory, "save", version, state_dict_type, index, timeout=240)
    assert saved[0][1] == _expected_listing(state_dict_type, index)
    loaded = pool.run(round_trip, directory, "load", version, state_dict_type, index, timeout=240)
    for rank in (0, 1):
        assert loaded[rank][2] == {"step": 7}  # what the Accelerator takes over
        assert loaded[rank][3] == saved[rank][3] == 2  # the scheduler's count
        assert torch.equal(loaded[rank][4], saved[rank][4])  # each rank's RNG continues
    assert not torch.equal(saved[0][4], saved[1][4])  # (ranks' streams differ: per-rank files)
    # The loaded run continues exactly where the saving one did (weights and AdamW moments) ...
    assert max_difference(loaded[0][0], saved[0][0]) < 1e-6
    # ... which is where one process gets on the same 4 global batches.
    assert max_difference(saved[0][0], reference_training(GLOBAL_BATCH, 4)) < 1e-5
    if state_dict_type == "SHARDED_STATE_DICT":
        # The folder holds the weights at save time: 2 steps of training.
        _merge_checks(
            Path(directory) / "pytorch_model_fsdp_0",
            tmp_path / "merged",
            reference_training(GLOBAL_BATCH, 2),
        )


def refused_combinations(directory):
    """What Cadence cannot write in Accelerate's layout is refused before anything is written."""
    from cadence.utils import save_fsdp_model

    acc, plugin = _accelerator(2, "SHARDED_STATE_DICT")
    model = acc.prepare(make_model())
    messages = []
    for kwargs in ({"adapter_only": True}, {"use_dcp": False}):
        try:
            save_fsdp_model(plugin, acc, model, directory, **kwargs)
        except ValueError as err:
            messages.append(str(err))
    return messages, os.path.exists(directory)


def test_what_cannot_be_written_in_accelerates_layout_is_refused(dist_pool, tmp_path):
    for messages, exists in dist_pool(2).run(refused_combinations, str(tmp_path / "x")):
        assert len(messages) == 2 and not exists
        assert "adapter_only=True" in messages[0] and "use_dcp=False" in messages[1]


class TinyModel(torch.nn.Module):
    """Two 16x16 linear layers around a ReLU (the model of Accelerate's scenario)."""

    def __init__(self) -> None:
        super().__init__()
        self.linear1 = torch.nn.Linear(16, 16)
        self.activation = torch.nn.ReLU()
        self.linear2 = torch.nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear2(self.activation(self.linear1(x)))


def merge_weights_scenario(directory):
    """Accelerate's test_merge_weights steps: FSDP1 full sharding with a size-based wrap policy and
    sharded state dicts, the model prepared alone and again with its loader and optimizer, 3 epochs
    of SGD, `save_fsdp_model` into a Path, then each process compares the merged files."""
    from safetensors.torch import load_file
    from torch.distributed.fsdp.fully_sharded_data_parallel import ShardingStrategy, StateDictType

    from cadence import Accelerator, FullyShardedDataParallelPlugin
    from cadence.commands.merge import merge_command, merge_command_parser
    from cadence.test_utils.training import RegressionDataset
    from cadence.utils import merge_fsdp_weights, patch_environment, save_fsdp_model

    plugin = FullyShardedDataParallelPlugin(
        sharding_strategy=ShardingStrategy.FULL_SHARD,
        state_dict_type=StateDictType.SHARDED_STATE_DICT,
    )
    torch.manual_seed(0)
    model = TinyModel()
    with patch_environment(fsdp_auto_wrap_policy="SIZE_BASED_WRAP"):
        plugin.set_auto_wrap_policy(model)
    accelerator = Accelerator(fsdp_plugin=plugin)
    model = accelerator.prepare(model)
    loader = torch.utils.data.DataLoader(RegressionDataset(length=128, seed=42), batch_size=16)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loader, model, optimizer = accelerator.prepare(loader, model, optimizer)
    for _ in range(3):
        for batch in loader:
            model.zero_grad()
            loss = torch.nn.functional.mse_loss(model(batch["x"]), batch["y"])
            accelerator.backward(loss)
            optimizer.step()
    accelerator.wait_for_everyone()
    path = Path(directory)
    path.mkdir(parents=True, exist_ok=True)
    save_fsdp_model(plugin, accelerator, model, path)
    accelerator.wait_for_everyone()
    trained = {k: v.cpu() for k, v in accelerator.get_state_dict(model).items()}
    untrained = TinyModel().state_dict()
    results = []
    if accelerator.is_main_process:
        folder = path / "pytorch_model_fsdp_0"
        merge_fsdp_weights(folder, path / "a", safe_serialization=True)
        merge_command(merge_command_parser().parse_args([str(folder), str(path / "b")]))
        merge_fsdp_weights(folder, path / "c", safe_serialization=False)
        argv = [str(folder), str(path / "d"), "--unsafe_serialization"]
        merge_command(merge_command_parser().parse_args(argv))
        for merged in (
            load_file(path / "a" / "model.safetensors"),
            load_file(path / "b" / "model.safetensors"),
            torch.load(path / "c" / "pytorch_model.bin", weights_only=True),
            torch.load(path / "d" / "pytorch_model.bin", weights_only=True),
        ):
            fresh = TinyModel()
            fresh.load_state_dict(merged)  # every key, the right shapes
            results.append(
                (
                    max_difference(fresh.state_dict(), trained),
                    max_difference(untrained, trained),
                )
            )
    accelerator.wait_for_everyone()
    return sorted(os.listdir(path)), results


def test_accelerates_merge_weights_scenario(dist_pool, tmp_path):
    outcomes = dist_pool(2).run(merge_weights_scenario, str(tmp_path / "weights"), timeout=240)
    listing, results = outcomes[0]
    assert listing == ["a", "b", "c", "d", "pytorch_model_fsdp_0"]
    assert len(results) == 4
    for merged_vs_trained, untrained_vs_trained in results:
        assert merged_vs_trained == 0.0  # the merged files are the trained weights ...
        assert untrained_vs_trained > 1e-3  # ... which training moved away from a fresh model's


@pytest.mark.parametrize("safe_serialization", [True, False])
@pytest.mark.parametrize("map_location", [None, "on_device"])
def test_accelerator_state_functions_round_trip_in_accelerates_layout(
    tmp_path, safe_serialization, map_location
):
    """One process: two models, an optimizer with state, a scheduler, a scaler and the RNG come back
    from Accelerate's file names; a bad map_location is refused before anything is read."""
    from cadence.checkpointing import load_accelerator_state, save_accelerator_state

    torch.manual_seed(0)
    models = [torch.nn.Linear(4, 4), torch.nn.Linear(4, 2)]
    optimizer = torch.optim.AdamW(models[0].parameters(), lr=0.1)
    models[0](torch.randn(2, 4)).sum().backward()
    optimizer.step()
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
    scheduler.step()
    scaler = torch.amp.GradScaler("cpu", init_scale=64.0)
    states = [m.state_dict() for m in models]
    out = save_accelerator_state(
        tmp_path, states, [optimizer], [scheduler], [], 0, step=5, scaler=scaler,
        safe_serialization=safe_serialization,
    )  # fmt: skip
    drawn = torch.rand(2)
    weights = ["model.safetensors", "model_1.safetensors"]
    if not safe_serialization:
        weights = ["pytorch_model.bin", "pytorch_model_1.bin"]
    expected = [*weights, "optimizer.bin", "random_states_0.pkl", "scaler.pt", "scheduler.bin"]
    assert out == tmp_path and sorted(os.listdir(tmp_path)) == sorted(expected)

    with pytest.raises(TypeError, match="Unsupported optimizer map location"):
        load_accelerator_state(tmp_path, [], [], [], [], 0, map_location="cuda:7")
    fresh = [torch.nn.Linear(4, 4), torch.nn.Linear(4, 2)]
    fresh_optimizer = torch.optim.AdamW(fresh[0].parameters(), lr=0.1)
    fresh_scheduler = torch.optim.lr_scheduler.StepLR(fresh_optimizer, step_size=1, gamma=0.5)
    fresh_scaler = torch.amp.GradScaler("cpu")
    torch.manual_seed(99)
    restored = load_accelerator_state(
        tmp_path, fresh, [fresh_optimizer], [fresh_scheduler], [], 0, scaler=fresh_scaler,
        map_location=map_location,
    )  # fmt: skip
    assert restored == {"step": 5}
    assert torch.equal(torch.rand(2), drawn)
    for model, state in zip(fresh, states):
        assert max_difference(model.state_dict(), state) == 0.0
    moments = fresh_optimizer.state_dict()["state"][0]["exp_avg"]
    assert torch.equal(moments, optimizer.state_dict()["state"][0]["exp_avg"])
    assert fresh_scheduler.last_epoch == 1 and fresh_optimizer.param_groups[0]["lr"] == 0.05
    assert fresh_scaler.get_scale() == 64.0
