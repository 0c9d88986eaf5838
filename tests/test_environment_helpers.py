"""Environment helpers, the one boolean parser, version comparisons and availability checks."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

import pytest
import torch

from cadence.core.environment import (
    are_libraries_initialized,
    clear_environment,
    convert_dict_to_env_variables,
    get_cpu_distributed_information,
    get_int_from_env,
    parse_choice_from_env,
    parse_flag_from_env,
    patch_environment,
    purge_accelerate_environment,
    str_to_bool,
)
from cadence.utils import compare_versions, is_torch_version


@pytest.mark.parametrize("word", ["y", "yes", "t", "true", "on", "1", "YES", " True "])
def test_true_words(word):
    assert str_to_bool(word) == 1 and str_to_bool(word, to_bool=True) is True


@pytest.mark.parametrize("word", ["n", "no", "f", "false", "off", "0", "OFF"])
def test_false_words(word):
    assert str_to_bool(word) == 0 and str_to_bool(word, to_bool=True) is False


@pytest.mark.parametrize("word", ["2", "maybe", "", "enabled"])
def test_other_words_are_refused(word):
    with pytest.raises(ValueError, match="invalid truth value"):
        str_to_bool(word)


def test_flag_choice_and_int_readers(monkeypatch):
    monkeypatch.setenv("CADENCE_T_FLAG", "yes")
    monkeypatch.setenv("CADENCE_T_CHOICE", "fp16")
    monkeypatch.setenv("CADENCE_T_NEG", "-1")
    monkeypatch.setenv("CADENCE_T_INT", "3")
    assert parse_flag_from_env("CADENCE_T_FLAG") is True
    assert parse_flag_from_env("CADENCE_T_UNSET") is False
    assert parse_flag_from_env("CADENCE_T_UNSET", True) is True
    assert parse_choice_from_env("CADENCE_T_CHOICE") == "fp16"
    assert parse_choice_from_env("CADENCE_T_UNSET") == "no"
    # The first non-negative value wins; negative values count as unset.
    assert get_int_from_env(["CADENCE_T_NEG", "CADENCE_T_INT"], 7) == 3
    assert get_int_from_env(["CADENCE_T_UNSET"], 7) == 7
    monkeypatch.setenv("CADENCE_T_INT", "three")
    with pytest.raises(ValueError, match="CADENCE_T_INT"):
        get_int_from_env(["CADENCE_T_INT"], 0)


def test_patch_environment_restores_and_removes(monkeypatch):
    monkeypatch.setenv("CADENCE_T_KEEP", "before")
    monkeypatch.delenv("CADENCE_T_NEW", raising=False)
    with patch_environment(cadence_t_keep=1, CADENCE_T_NEW="x"):
        assert os.environ["CADENCE_T_KEEP"] == "1" and os.environ["CADENCE_T_NEW"] == "x"
    assert os.environ["CADENCE_T_KEEP"] == "before" and "CADENCE_T_NEW" not in os.environ


def test_patch_environment_restores_after_an_exception(monkeypatch):
    monkeypatch.delenv("CADENCE_T_NEW", raising=False)
    with pytest.raises(RuntimeError), patch_environment(CADENCE_T_NEW="x"):
        raise RuntimeError("boom")
    assert "CADENCE_T_NEW" not in os.environ


def test_clear_environment_empties_then_restores(monkeypatch):
    monkeypatch.setenv("CADENCE_T_FOO", "bar")
    with clear_environment():
        assert dict(os.environ) == {}
        os.environ["CADENCE_T_FOO"] = "inside"
    assert os.environ["CADENCE_T_FOO"] == "bar"


def test_purge_removes_variables_a_function_and_a_class_set(monkeypatch):
    monkeypatch.setenv("ACCELERATE_T_KEPT", "old")

    @purge_accelerate_environment
    def sets_variables():
        os.environ["ACCELERATE_MIXED_PRECISION_T"] = "fp16"
        os.environ["ACCELERATE_T_KEPT"] = "changed"
        return 5

    assert sets_variables() == 5
    assert (
        "ACCELERATE_MIXED_PRECISION_T" not in os.environ
        and os.environ["ACCELERATE_T_KEPT"] == "old"
    )

    @purge_accelerate_environment
    class Case:
        def test_sets(self):
            os.environ["CADENCE_T_FROM_CLASS"] = "1"

    Case().test_sets()
    assert "CADENCE_T_FROM_CLASS" not in os.environ


def test_convert_dict_to_env_variables_skips_unsafe_entries(caplog):
    lines = convert_dict_to_env_variables({"A": "1", "BAD": "<x", "EMPTY": "", "B": "2"})
    assert lines == ["A=1\n", "B=2\n"]
    assert "BAD" in caplog.text


def test_cpu_information_reads_mpi_variables(monkeypatch):
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("PMI_RANK", "3")
    monkeypatch.setenv("PMI_SIZE", "4")
    info = get_cpu_distributed_information()
    assert (info.rank, info.world_size, info.local_rank, info.local_world_size) == (3, 4, 0, 1)


def test_are_libraries_initialized():
    assert are_libraries_initialized("torch", "surely_not_imported_pkg") == ["torch"]


def test_version_comparisons():
    assert compare_versions("torch", ">=", "1.0")
    assert is_torch_version(">=", "2.0") and not is_torch_version("<", "1.0")
    from packaging.version import parse

    assert compare_versions(parse("1.2.3"), "<", "1.10")
    with pytest.raises(ValueError, match="operation"):
        compare_versions("torch", "~=", "1.0")


def test_availability_checks_are_truthful():
    from cadence import utils

    def installed(name):
        return importlib.util.find_spec(name) is not None

    assert utils.is_pytest_available()
    assert utils.is_deepspeed_available() == installed("deepspeed")
    assert utils.is_torch_xla_available() == installed("torch_xla")
    assert utils.is_transformers_available() == installed("transformers")
    assert utils.is_cuda_available() == torch.cuda.is_available()
    assert utils.is_npu_available() is False or installed("torch_npu")
    assert utils.is_hpu_available() is False or installed("habana_frameworks")
    assert utils.is_bf16_available() in (True, False)
    assert utils.is_torchdata_stateful_dataloader_available() == installed("torchdata")


def test_availability_checks_import_nothing():
    code = (
        "import sys, cadence, cadence.utils as u\n"
        "checks = [u.is_wandb_available(), u.is_deepspeed_available(), u.is_tensorboard_available(),"
        " u.is_mlflow_available(), u.is_transformers_available(), u.is_fp8_available()]\n"
        "print(sorted(m for m in ('wandb', 'deepspeed', 'tensorboard', 'mlflow', 'transformers', 'torchao')"
        " if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_enum_members_of_the_reference_exist_and_contain_values():
    from cadence.utils import DistributedType, DynamoBackend, PrecisionType, RNGType

    assert DistributedType.MULTI_NEURON.value == "MULTI_NEURON"
    assert RNGType.NEURON.value == "neuron" and DynamoBackend.NEURON.value == "NEURON"
    assert "fp16" in PrecisionType and "fp17" not in PrecisionType
    assert "MULTI_GPU" in DistributedType
