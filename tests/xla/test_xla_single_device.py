"""One XLA device (torch_xla's CPU device): detection, training with the same weights as eager CPU,
collectives, RNG, checkpoints, bf16, refused combinations. Run by `make test-xla` (in .venv-xla); skipped
where torch_xla is not installed (checked without importing it: the import alone costs seconds)."""

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


@pytest.fixture(scope="module")
def report() -> dict:
    return run_scenario("xla_single_device")


def test_detection_chooses_xla_without_import_cadence_loading_torch_xla(report):
    assert report["torch_xla_loaded_by_import_cadence"] is False
    assert report["distributed_type"] == "XLA"
    assert report["device_type"] == "xla"
    assert report["strategy"] == "XLAStrategy"
    assert (report["num_processes"], report["process_index"]) == (1, 0)
    # The reference reports -1 here (so its print prints nothing); one device is local process 0.
    assert report["local_process_index"] == 0
    assert report["is_main_process"] is True


def test_cpu_true_wins_over_pjrt_device(report):
    assert report["cpu_true_distributed_type"] == "NO"
    assert report["cpu_true_device"] == "cpu"


def test_prepare_moves_model_reties_weights_and_repoints_the_optimizer(report):
    assert report["param_device"] == "xla"
    assert report["tied_after_prepare"] is True
    assert report["optimizer_params_are_model_params"] is True
    assert report["batch_device"] == "xla"
    assert report["unwrap_is_model"] is True


def test_training_matches_eager_cpu(report):
    # Same data, accumulation of 2, clipping and SGD with momentum: float32 rounding differences only.
    assert len(report["losses_xla"]) == len(report["losses_cpu"]) == 16
    assert report["loss_max_abs_diff"] < 1e-5
    assert report["weights_max_abs_diff"] < 1e-5
    assert report["state_dict_devices"] == ["cpu"]


def test_collectives_on_one_device(report):
    assert report["gather"] == [0.0, 1.0, 2.0, 3.0]
    assert report["gather_device"] == "xla"
    assert report["reduce_sum"] == [0.0, 1.0, 2.0, 3.0]
    # `scale` multiplies after the reduction on XLA (documented: "only valid on XLA").
    assert report["reduce_sum_scale"] == [0.0, 2.0, 4.0, 6.0]
    assert report["reduce_mean_scale"] == [0.0, 0.5, 1.0, 1.5]
    assert report["broadcast"] == [0.0, 1.0, 2.0, 3.0]
    assert report["gather_object"] == [{"rank": 0}]
    assert report["pad"] == [[0.0, 1.0, 2.0, 3.0]]
    assert report["broadcast_object_list"] == ["a", 1]


def test_set_seed_seeds_the_xla_generator(report):
    assert report["xla_seed_after_set_seed"] == 1234
    assert report["xla_draws_repeat_after_set_seed"] is True


def test_save_state_load_state_round_trip(report):
    assert report["weights_moved_after_save"] > 1e-3  # training after the save changed the weights
    assert report["load_state_weights_diff"] == 0.0
    assert report["load_state_momentum_diff"] == 0.0
    assert report["load_state_param_device"] == "xla"
    assert report["load_state_momentum_device"] == ["xla"]
    assert report["load_state_tied"] is True
    assert report["load_state_xla_seed"] is True
    assert report["load_state_xla_draw_repeats"] is True
    assert "model.safetensors" in report["checkpoint_files"]
    assert "random_states_0.pkl" in report["checkpoint_files"]
    assert report["resumed_batch_matches"] is True


def test_accelerator_save_writes_cpu_tensors(report):
    assert report["save_devices"] == {"False": ["cpu"], "True": ["cpu"]}
    assert report["save_safe_False_diff"] == 0.0
    assert report["save_safe_True_diff"] == 0.0


def test_save_model_writes_cpu_safetensors(report):
    assert report["save_model_files"] == ["model.safetensors"]
    assert report["save_model_diff"] == 0.0
    assert report["save_model_keys_cover_model"] is True


def test_bf16_autocasts_on_xla(report):
    assert report["bf16_mixed_precision"] == "bf16"
    assert report["bf16_inner_dtype"] == "torch.bfloat16"
    assert report["bf16_output_dtype"] == "torch.float32"  # outputs come back in fp32
    assert report["bf16_losses_finite"] is True
    assert report["bf16_loss_max_abs_diff"] < 5e-2  # against eager CPU bf16 autocast


def test_bad_combinations_are_clear_errors_before_side_effects(report):
    errors = report["errors"]
    assert errors["fp16"].startswith("ValueError") and "not supported on XLA" in errors["fp16"]
    assert "bf16" in errors["fp16"]
    assert errors["fp8"].startswith("ValueError") and "not supported on XLA" in errors["fp8"]
    assert errors["deepspeed"].startswith("ValueError")
    assert "DeepSpeed does not run on XLA" in errors["deepspeed"]
    assert report["state_after_errors_initialized"] is False


def test_mp_device_loader_switch_gives_the_references_loader(report):
    # CADENCE_XLA_MP_DEVICE_LOADER=1: torch_xla's MpDeviceLoader (a thread running ahead), as the
    # reference wraps prepared loaders on XLA; training is the same.
    assert report["mp_loader_type"] == "MpDeviceLoaderWrapper"
    assert report["mp_loader_len"] == 16
    assert report["mp_loader_batch_device"] == "xla"
    assert report["mp_loader_steps"] == 16
    assert report["mp_loader_loss_max_abs_diff"] < 1e-5
