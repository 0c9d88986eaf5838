"""The config file: reference formats of several ages, errors, default location, `config default/update`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

from cadence.launch import config_file as cfg

CADENCE = [sys.executable, "-m", "cadence.commands.cli"]

# A file as `accelerate config` writes it today (multi-CPU, two machines).
CURRENT_FORMAT = """\
compute_environment: LOCAL_MACHINE
debug: false
distributed_type: MULTI_CPU
downcast_bf16: 'no'
enable_cpu_affinity: false
machine_rank: 1
main_process_ip: 10.0.0.1
main_process_port: 29555
main_training_function: main
mixed_precision: bf16
mpirun_config: {}
num_machines: 2
num_processes: 8
rdzv_backend: static
same_network: true
tpu_env: []
tpu_use_cluster: false
tpu_use_sudo: false
use_cpu: true
"""

# The 0.1x era: `fp16` instead of mixed_precision, no use_cpu/debug keys.
OLDEST_FORMAT = """\
compute_environment: LOCAL_MACHINE
distributed_type: MULTI_GPU
fp16: true
machine_rank: 0
main_process_ip: null
main_process_port: null
main_training_function: main
num_machines: 1
num_processes: 2
"""

# The 0.15-0.2x era: dynamo_backend at top level, TPU spelling, ipex_config, megatron section.
MIDDLE_FORMAT = """\
command_file: null
commands: null
compute_environment: LOCAL_MACHINE
deepspeed_config: {}
distributed_type: FSDP
downcast_bf16: 'no'
dynamo_backend: INDUCTOR
fsdp_config:
  fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP
  fsdp_backward_prefetch_policy: BACKWARD_PRE
  fsdp_offload_params: false
  fsdp_sharding_strategy: 1
  fsdp_state_dict_type: FULL_STATE_DICT
  fsdp_transformer_layer_cls_to_wrap: BertLayer
gpu_ids: 0,1
ipex_config:
  ipex: false
machine_rank: 0
main_process_ip: null
main_process_port: null
main_training_function: main
megatron_lm_config: {}
mixed_precision: fp16
num_machines: 1
num_processes: 2
rdzv_backend: static
same_network: true
tpu_name: null
tpu_zone: null
use_cpu: false
"""


def write(tmp_path: Path, text: str, name: str = "config.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_current_reference_file_loads_with_its_values(tmp_path):
    config = cfg.load_config_from_file(write(tmp_path, CURRENT_FORMAT))
    assert isinstance(config, cfg.ClusterConfig)
    assert config.distributed_type == "MULTI_CPU"
    assert (config.num_processes, config.num_machines, config.machine_rank) == (8, 2, 1)
    assert (config.main_process_ip, config.main_process_port) == ("10.0.0.1", 29555)
    assert config.mixed_precision == "bf16"
    assert config.use_cpu is True and config.same_network is True


def test_oldest_format_is_upgraded(tmp_path):
    config = cfg.load_config_from_file(write(tmp_path, OLDEST_FORMAT))
    assert config.mixed_precision == "fp16"
    assert config.use_cpu is False and config.debug is False
    assert "fp16" not in config.to_dict()


def test_middle_format_is_upgraded(tmp_path):
    config = cfg.load_config_from_file(write(tmp_path, MIDDLE_FORMAT))
    assert config.dynamo_config == {"dynamo_backend": "INDUCTOR"}
    assert config.fsdp_config["fsdp_sharding_strategy"] == 1
    assert config.gpu_ids == "0,1"
    saved = config.to_dict()
    assert "ipex_config" not in saved and "dynamo_backend" not in saved


def test_tpu_spelling_becomes_xla(tmp_path):
    text = "compute_environment: LOCAL_MACHINE\ndistributed_type: TPU\nmixed_precision: 'no'\n"
    assert cfg.load_config_from_file(write(tmp_path, text)).distributed_type == "XLA"


def test_json_config_file(tmp_path):
    data = {"compute_environment": "LOCAL_MACHINE", "distributed_type": "NO", "num_processes": 1}
    path = write(tmp_path, json.dumps(data), "config.json")
    config = cfg.load_config_from_file(path)
    assert config.distributed_type == "NO" and config.mixed_precision == "no"


def test_unknown_keys_are_listed(tmp_path):
    path = write(tmp_path, CURRENT_FORMAT + "num_gpus: 4\nzebra: true\n")
    with pytest.raises(cfg.ConfigFileError) as err:
        cfg.load_config_from_file(path)
    assert "num_gpus" in str(err.value) and "zebra" in str(err.value)
    assert str(path) in str(err.value)


def test_malformed_yaml_names_file_and_line(tmp_path):
    path = write(tmp_path, "distributed_type: MULTI_CPU\nnum_processes: [2,\n")
    with pytest.raises(cfg.ConfigFileError) as err:
        cfg.load_config_from_file(path)
    message = str(err.value)
    assert "not valid YAML" in message and "config.yaml" in message and "line" in message


@pytest.mark.parametrize(
    "text, fragment",
    [
        ("", "empty"),
        ("- a\n- b\n", "not a mapping"),
        ("compute_environment: LOCAL_MACHINE\nnum_processes: 2\n", "no distributed_type"),
        ("distributed_type: MULTI_TPU\n", "MULTI_TPU"),
        ("distributed_type: NO\nnum_processes: two\n", "num_processes must be an integer"),
        ("distributed_type: NO\nmixed_precision: fp32\n", "mixed_precision must be one of"),
        ("distributed_type: NO\nuse_cpu: maybe\n", "use_cpu must be true or false"),
    ],
)
def test_invalid_files_are_clear_errors(tmp_path, text, fragment):
    with pytest.raises(cfg.ConfigFileError, match=fragment):
        cfg.load_config_from_file(write(tmp_path, text))


def test_missing_file_is_a_clear_error(tmp_path):
    with pytest.raises(cfg.ConfigFileError, match="does not exist"):
        cfg.load_config_from_file(tmp_path / "nope.yaml")


def test_default_location_follows_environment(tmp_path):
    assert cfg.default_config_path({"HF_HOME": "/a", "XDG_CACHE_HOME": "/b"}) == Path(
        "/a/cadence/default_config.yaml"
    )
    assert cfg.default_config_path({"XDG_CACHE_HOME": "/b"}) == Path(
        "/b/huggingface/cadence/default_config.yaml"
    )
    home = Path(os.path.expanduser("~"))
    assert cfg.default_config_path({}) == home / ".cache/huggingface/cadence/default_config.yaml"


def test_save_then_load_round_trip(tmp_path):
    original = cfg.ClusterConfig(
        distributed_type="MULTI_CPU",
        num_processes=3,
        mixed_precision="bf16",
        use_cpu=True,
        dynamo_config={"dynamo_backend": "EAGER"},
    )
    for name in ("round.yaml", "round.json"):
        path = original.save(tmp_path / "sub" / name)
        again = cfg.load_config_from_file(path)
        assert again.to_dict() == original.to_dict()
    assert yaml.safe_load((tmp_path / "sub" / "round.yaml").read_text())["num_processes"] == 3


def test_basic_config_without_gpus_is_one_cpu_process():
    config = cfg.basic_config("BF16", gpu_count=0)
    assert (config.distributed_type, config.num_processes, config.use_cpu) == ("NO", 1, True)
    assert config.mixed_precision == "bf16"
    with pytest.raises(cfg.ConfigFileError, match="mixed_precision"):
        cfg.basic_config("fp32", gpu_count=0)


def test_basic_config_with_gpus_uses_all_of_them():
    config = cfg.basic_config("fp16", gpu_count=4)
    assert (config.distributed_type, config.num_processes, config.use_cpu) == (
        "MULTI_GPU",
        4,
        False,
    )
    assert cfg.basic_config(gpu_count=1).distributed_type == "NO"


def run_cli(*args: str, env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*CADENCE, *args], env=env, cwd=cwd, capture_output=True, text=True, timeout=60
    )


@pytest.fixture
def cli_env(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("CADENCE_")}
    env["HF_HOME"] = str(tmp_path / "hf")
    return env


def test_config_default_writes_default_location_once(tmp_path, cli_env):
    result = run_cli("config", "default", "--mixed_precision", "bf16", env=cli_env, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    path = tmp_path / "hf" / "cadence" / "default_config.yaml"
    written = yaml.safe_load(path.read_text())
    assert (
        written["mixed_precision"] == "bf16" and written["compute_environment"] == "LOCAL_MACHINE"
    )
    cfg.config_from_dict(written)  # what it writes, it can read
    # Accelerate writes JSON into default_config.yaml (sorted keys, 2 spaces): the same bytes here.
    assert json.loads(path.read_text()) == written
    assert path.read_text() == json.dumps(written, indent=2, sort_keys=True) + "\n"
    before = path.read_text()
    again = run_cli("config", "default", "--mixed_precision", "fp16", env=cli_env, cwd=tmp_path)
    assert again.returncode == 0 and "already exists" in again.stdout
    assert path.read_text() == before


def test_config_update_rewrites_old_file(tmp_path, cli_env):
    path = write(tmp_path, MIDDLE_FORMAT, "old.yaml")
    result = run_cli("config", "update", "--config_file", str(path), env=cli_env, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "ipex_config" in result.stdout  # the report says what changed
    updated = yaml.safe_load(path.read_text())
    assert "ipex_config" not in updated and "dynamo_backend" not in updated
    assert updated["dynamo_config"] == {"dynamo_backend": "INDUCTOR"}
    assert updated["fsdp_config"]["fsdp_transformer_layer_cls_to_wrap"] == "BertLayer"


def test_config_update_reports_bad_file(tmp_path, cli_env):
    path = write(tmp_path, textwrap.dedent("distributed_type: NO\nbogus_key: 1\n"), "bad.yaml")
    result = run_cli("config", "update", "--config_file", str(path), env=cli_env, cwd=tmp_path)
    assert result.returncode == 1 and "bogus_key" in result.stderr


@pytest.mark.parametrize("name", ["config.yaml", "config.json", "config"])
def test_to_json_file_and_to_yaml_file_write_their_format_whatever_the_name(tmp_path, name):
    # As Accelerate's: to_json_file writes JSON and to_yaml_file YAML, whatever the file is called.
    config = cfg.config_from_dict(
        {
            "compute_environment": "LOCAL_MACHINE",
            "distributed_type": "MULTI_CPU",
            "num_processes": 2,
        }
    )
    config.to_json_file(tmp_path / name)
    as_json = json.loads((tmp_path / name).read_text())
    assert as_json["num_processes"] == 2
    config.to_yaml_file(tmp_path / name)
    text = (tmp_path / name).read_text()
    assert not text.lstrip().startswith("{") and yaml.safe_load(text) == as_json
