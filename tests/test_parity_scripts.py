"""Behaviours the reference's distributed test scripts (`accelerate/test_utils/scripts`, run translated
to `cadence` as an external check) rely on, each tested here on its own, across real processes where
it is about several processes:

- `from accelerate.accelerator import Accelerator, DataLoaderConfiguration, GradientAccumulationPlugin`
  (test_sync.py, test_distributed_data_loop.py): the configuration classes import from the
  Accelerator's module path;
- `AcceleratorState._reset_state()` under a live Accelerator (test_script.py): `prepare()` fails early
  with the reference's "`AcceleratorState` object has no attribute" error, and the stale state object
  can still barrier, split and `destroy_process_group()`;
- `save_state(tmpdir)` with a different temporary folder on each process
  (test_distributed_data_loop.py): each folder is a whole checkpoint that loads back exactly.
"""

from __future__ import annotations

import pytest
import torch


def test_configuration_classes_import_from_the_accelerator_module_path():
    import cadence
    import cadence.utils
    from cadence.accelerator import (
        Accelerator,
        DataLoaderConfiguration,
        DeepSpeedPlugin,
        DistributedType,
        FullyShardedDataParallelPlugin,
        GradientAccumulationPlugin,
        GradientState,
        ProjectConfiguration,
    )

    assert Accelerator is cadence.Accelerator
    assert DataLoaderConfiguration is cadence.DataLoaderConfiguration
    assert GradientAccumulationPlugin is cadence.GradientAccumulationPlugin
    assert ProjectConfiguration is cadence.ProjectConfiguration
    assert DeepSpeedPlugin is cadence.DeepSpeedPlugin
    assert FullyShardedDataParallelPlugin is cadence.FullyShardedDataParallelPlugin
    assert DistributedType is cadence.utils.DistributedType
    assert GradientState is cadence.state.GradientState


def test_prepare_after_the_state_was_reset_names_the_reset():
    from cadence import Accelerator
    from cadence.state import AcceleratorState

    accelerator = Accelerator(cpu=True)
    model = torch.nn.Linear(1, 1)
    AcceleratorState._reset_state()
    with pytest.raises(AttributeError) as caught:
        accelerator.prepare(model)
    message = str(caught.value.args[0])
    assert "`AcceleratorState` object has no attribute" in message
    assert "This happens if `AcceleratorState._reset_state()`" in message
    assert not hasattr(model, "_is_accelerator_prepared")  # nothing was prepared


def stale_state_still_controls_the_processes():
    from cadence import Accelerator
    from cadence.state import AcceleratorState

    state = Accelerator(cpu=True).state
    AcceleratorState._reset_state()
    with state.split_between_processes(list(range(4))) as share:
        mine = list(share)
    state.wait_for_everyone()
    with state.main_process_first():
        pass
    state.destroy_process_group()  # the pool's group is not Cadence's: left alone, no error
    return mine


def test_a_reset_accelerator_state_still_splits_waits_and_ends(dist_pool):
    assert dist_pool(2).run(stale_state_still_controls_the_processes) == [[0, 1], [2, 3]]


def join_under_another_backend():
    import warnings

    from cadence import Accelerator, DistributedType

    accelerator = Accelerator(cpu=True)
    original = accelerator.state.distributed_type
    # As test_distributed_data_loop.py does: the state says FSDP, whose models torch's Join cannot take.
    accelerator.state.distributed_type = DistributedType.FSDP
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with accelerator.join_uneven_inputs(
                [torch.nn.Linear(1, 1)]
            ):  # not joinable: never joined
                pass
    finally:
        accelerator.state.distributed_type = original
    return [str(w.message) for w in caught if issubclass(w.category, UserWarning)]


def test_join_uneven_inputs_warns_and_does_nothing_outside_ddp(dist_pool):
    for messages in dist_pool(2).run(join_under_another_backend):
        assert len(messages) == 1 and "only supported for multi-GPU" in messages[0]


def pickled_accelerator_state_matches():
    import pickle

    from cadence import Accelerator

    accelerator = Accelerator(cpu=True)
    accelerator.prepare(torch.utils.data.DataLoader(list(range(32)), batch_size=4))
    copy = pickle.loads(pickle.dumps(accelerator))
    # What test_distributed_data_loop.py compares: the copy describes the same process.
    return accelerator.state.__dict__ == copy.state.__dict__, copy.state.process_index


def test_a_pickled_accelerator_has_an_equal_state(dist_pool):
    assert dist_pool(2).run(pickled_accelerator_state_matches) == [(True, 0), (True, 1)]


CATCHES_CHILD_FAILED = """
import sys
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
from cadence import notebook_launcher

def bipolar():
    from cadence import PartialState
    if PartialState().process_index == 0:
        raise RuntimeError("I'm an even process.")

if __name__ == "__main__":
    try:
        notebook_launcher(bipolar, (), num_processes=2, use_port=sys.argv[1])
    except ChildFailedError as error:  # what test_notebook.py catches
        print("caught:", str(error).splitlines()[0], "| failed ranks:", sorted(error.failures))
        print("root cause in message:", "I'm an even process." in str(error))
"""


def test_a_failed_notebook_launch_is_torchs_child_failed_error(tmp_path):
    import os
    import subprocess
    import sys

    from harness import free_port

    script = tmp_path / "catch.py"
    script.write_text(CATCHES_CHILD_FAILED)
    env = dict(os.environ, OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="")  # CPU workers (gloo)
    result = subprocess.run(
        [sys.executable, str(script), str(free_port())],
        capture_output=True, text=True, timeout=180, env=env,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert "caught: notebook_launcher: rank 0 failed (exit code 1)" in result.stdout
    assert "failed ranks: [0]" in result.stdout
    assert "root cause in message: True" in result.stdout


def save_into_a_folder_of_each_process(base: str):
    import os
    import shutil

    from torch.utils.data import DataLoader

    from cadence import Accelerator

    accelerator = Accelerator(cpu=True)
    torch.manual_seed(0)
    model = torch.nn.Linear(2, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = DataLoader(list(range(16)), batch_size=2, shuffle=True)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    folder = os.path.join(base, f"own-folder-of-rank-{accelerator.process_index}")
    batches = iter(loader)
    next(batches)
    accelerator.save_state(folder)
    unseen = [batch.tolist() for batch in batches]
    saved_weight = accelerator.unwrap_model(model).weight.detach().clone()
    with torch.no_grad():
        accelerator.unwrap_model(model).weight.add_(1.0)
    # What Ray Train (or any per-worker upload) does: a plain file-level union of the folders.
    union = os.path.join(base, "union")
    if accelerator.is_main_process:
        for rank in range(accelerator.num_processes):
            shutil.copytree(
                os.path.join(base, f"own-folder-of-rank-{rank}"), union, dirs_exist_ok=True
            )
    accelerator.wait_for_everyone()
    accelerator.load_state(union)
    resumed = [batch.tolist() for batch in loader]
    return {
        "files": sorted(os.listdir(folder)),
        "resumed_equals_unseen": resumed == unseen and len(unseen) == 3,
        "weights_restored": torch.equal(accelerator.unwrap_model(model).weight, saved_weight),
    }


def test_each_process_may_save_into_its_own_folder(dist_pool, tmp_path):
    results = dist_pool(2).run(save_into_a_folder_of_each_process, str(tmp_path))
    for rank, result in enumerate(results):
        # Each folder holds what its rank owns (issue 27): the main process the replicated states,
        # every rank its own RNG and loader states with its own manifest part.
        owned = [
            f"cadence_manifest.rank{rank}.json",
            f"dl_state_dict_rank{rank}.bin",
            f"random_states_{rank}.pkl",
        ]
        replicated = ["model.safetensors", "optimizer.bin"] if rank == 0 else []
        assert set(owned + replicated) <= set(result["files"]), result["files"]
        if rank:
            assert "model.safetensors" not in result["files"]
        # The union of the folders resumes exactly.
        assert result["resumed_equals_unseen"] and result["weights_restored"]
