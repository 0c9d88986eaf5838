"""Several XLA devices from one process through SPMD (CPU_NUM_DEVICES=4 on torch_xla's CPU device):
data parallelism and FSDPv2 chosen from the existing ParallelismConfig / FSDP plugin, each ending with the
weights of eager CPU training on the same global batch. Run by `make test-xla`; skipped without torch_xla."""

from __future__ import annotations

import importlib.util

import pytest

if importlib.util.find_spec("torch_xla") is None:
    pytest.skip(
        "torch_xla is not installed (`make test-xla` builds .venv-xla with it)",
        allow_module_level=True,
    )

from xla_runner import run_scenario  # noqa: E402

pytestmark = pytest.mark.xla

SHARDED_BATCH = "{devices=[4,1]0,1,2,3}"  # dimension 0 split over the 4 devices


@pytest.fixture(scope="module")
def report() -> dict:
    return run_scenario("xla_spmd", CPU_NUM_DEVICES="4")


@pytest.mark.parametrize("name", ["dp", "fsdp_plugin", "fsdp_config", "hsdp"])
def test_spmd_training_matches_eager_cpu_on_the_same_global_batch(report, name):
    result = report[name]
    assert result["num_processes"] == 1  # one process drives the 4 devices
    assert result["distributed_type"] == "XLA"
    assert result["steps"] == 16
    assert result["batch_shardings"] == [SHARDED_BATCH]
    assert result["loss_max_abs_diff"] < 1e-5
    assert result["weights_max_abs_diff"] < 1e-5
    assert result["reload_diff"] == 0.0  # save_state / load_state round trip
    assert result["unwrapped"] == "TiedNet"


def test_data_parallel_replicates_the_parameters(report):
    assert report["dp"]["wrapper"] == "TiedNet"
    assert report["dp"]["param_sharding"] == "{replicated}"
    assert report["dp"]["mesh_shape"] == [4]


@pytest.mark.parametrize("name", ["fsdp_plugin", "fsdp_config"])
def test_fsdpv2_shards_the_parameters_over_the_devices(report, name):
    assert report[name]["wrapper"] == "SpmdFullyShardedDataParallel"
    assert report[name]["param_sharding"] == SHARDED_BATCH
    assert report[name]["mesh_shape"] == [4]


def test_hybrid_shards_over_fsdp_and_replicates_over_data(report):
    assert report["hsdp"]["mesh_shape"] == [2, 2]
    assert "last_tile_dim_replicate" in report["hsdp"]["param_sharding"]


def test_layouts_xla_cannot_run_are_clear_errors(report):
    errors = report["errors"]
    assert errors["wrong_size"].startswith("ValueError")
    assert "this host has 4" in errors["wrong_size"]
    assert errors["tp"].startswith("NotImplementedError")
    assert "tensor, context and sequence parallelism are not supported" in errors["tp"]
    assert errors["wrong_size_left_state"] is False and errors["tp_left_state"] is False
