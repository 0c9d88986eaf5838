"""`cadence launch` planning: precedence flag > env > config file > default, validation, worker settings.

Cheap: nothing is started. Most tests resolve plans in-process; a few go through the real CLI with --dry_run
or with bad input (the launcher must refuse before starting anything).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from cadence.core.settings import LAUNCH_CONFIG_ENV, read_launch_config
from cadence.launch.args import build_launch_parser
from cadence.launch.plan import LaunchPlanError, build_plan
from cadence.runtime.hardware import free_port

CADENCE = [sys.executable, "-m", "cadence.commands.cli"]


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text("print('hi')\n")
    return tmp_path


def plan_for(argv, env=None, gpus=0):
    parser, _ = build_launch_parser()
    args, unknown = parser.parse_known_args(argv)
    assert not unknown
    return build_plan(args, env={} if env is None else env, gpu_count=lambda: gpus)


def write_config(path: Path, **values) -> Path:
    base = {
        "compute_environment": "LOCAL_MACHINE",
        "distributed_type": "MULTI_CPU",
        "use_cpu": True,
    }
    base.update(values)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(base) if path.suffix == ".json" else _yaml(base))
    return path


def _yaml(data) -> str:
    import yaml

    return yaml.safe_dump(data)


def test_defaults_on_a_cpu_machine(workdir):
    plan = plan_for(["train.py", "--lr", "3"])
    assert plan.num_processes == 1 and plan.settings["num_processes"].source.startswith("default")
    assert (plan.device.value, plan.backend, plan.distributed_type) == ("cpu", "gloo", "NO")
    assert plan.script_args == ["--lr", "3"]
    assert plan.value("mixed_precision") == "no"
    assert not plan.multi_process


def test_each_layer_overrides_the_one_below(workdir):
    config = write_config(
        workdir / "c.yaml", num_processes=3, mixed_precision="fp16", main_process_port=29650
    )
    env = {"CADENCE_MIXED_PRECISION": "bf16", "CADENCE_MAIN_PROCESS_PORT": "29651"}
    port = free_port()
    plan = plan_for(
        ["--config_file", str(config), "--main_process_port", str(port), "train.py"], env
    )
    assert (
        plan.settings["num_processes"].value == 3
        and plan.settings["num_processes"].source == "config file"
    )
    assert plan.settings["mixed_precision"].value == "bf16"
    assert plan.settings["mixed_precision"].source == "env CADENCE_MIXED_PRECISION"
    assert plan.settings["main_process_port"].value == port
    assert plan.settings["main_process_port"].source == "flag"
    assert (
        plan.settings["max_restarts"].value == 0
        and plan.settings["max_restarts"].source == "default"
    )


@pytest.mark.parametrize(
    "flag, env_value, config_value, expected, source",
    [
        (None, None, None, 1, "default"),
        (None, None, 3, 3, "config file"),
        (None, "2", 3, 2, "env CADENCE_NUM_PROCESSES"),
        ("4", "2", 3, 4, "flag"),
    ],
)
def test_num_processes_precedence(workdir, flag, env_value, config_value, expected, source):
    argv = []
    if config_value is not None:
        argv += ["--config_file", str(write_config(workdir / "c.yaml", num_processes=config_value))]
    if flag is not None:
        argv += ["--num_processes", flag]
    env = {} if env_value is None else {"CADENCE_NUM_PROCESSES": env_value}
    setting = plan_for([*argv, "train.py"], env).settings["num_processes"]
    assert setting.value == expected
    assert setting.source.startswith(source)


def test_default_config_file_is_found_through_hf_home(workdir):
    write_config(workdir / "hf" / "cadence" / "default_config.yaml", num_processes=2)
    plan = plan_for(["train.py"], {"HF_HOME": str(workdir / "hf")})
    assert plan.num_processes == 2 and plan.config_file.endswith("default_config.yaml")
    # --cpu means a plain CPU run: the machine's default file is not read (the reference does the same).
    assert plan_for(["--cpu", "train.py"], {"HF_HOME": str(workdir / "hf")}).num_processes == 1


def test_cpu_machine_really_starts_the_requested_processes(workdir):
    for argv in (["--num_processes", "4"], ["--cpu", "--num_processes", "4"]):
        plan = plan_for([*argv, "train.py"])
        assert plan.multi_process and plan.nproc_per_node == 4
        assert (plan.backend, plan.distributed_type) == ("gloo", "MULTI_CPU")
        assert "--nproc_per_node" in plan.torchrun_args
        assert plan.torchrun_args[plan.torchrun_args.index("--nproc_per_node") + 1] == "4"


def test_gpu_config_on_a_cpu_machine_runs_on_cpu_and_says_so(workdir):
    config = write_config(
        workdir / "g.yaml", distributed_type="MULTI_GPU", use_cpu=False, num_processes=2
    )
    plan = plan_for(["--config_file", str(config), "train.py"])
    assert (plan.device.value, plan.backend, plan.num_processes) == ("cpu", "gloo", 2)
    assert any("no GPU" in note for note in plan.notes)


def test_workers_get_one_settings_record(workdir):
    plan = plan_for(["--num_processes", "2", "--mixed_precision", "bf16", "--debug", "train.py"])
    record = read_launch_config({LAUNCH_CONFIG_ENV: plan.worker_env[LAUNCH_CONFIG_ENV]})
    assert record["num_processes"] == 2 and record["backend"] == "gloo"
    assert record["mixed_precision"] == "bf16" and record["debug"] is True
    assert record["use_cpu"] is True and record["distributed_type"] == "MULTI_CPU"
    assert set(plan.worker_env) == {LAUNCH_CONFIG_ENV, "OMP_NUM_THREADS"}


def test_thread_count_comes_from_flag_or_omp(workdir):
    assert (
        plan_for(["--num_cpu_threads_per_process", "3", "train.py"]).worker_env["OMP_NUM_THREADS"]
        == "3"
    )
    plan = plan_for(["train.py"], {"OMP_NUM_THREADS": "5"})
    assert plan.worker_env["OMP_NUM_THREADS"] == "5"
    assert plan.settings["num_cpu_threads_per_process"].source == "env OMP_NUM_THREADS"


def test_gpu_machine_uses_nccl_and_every_gpu(workdir):
    plan = plan_for(["train.py"], gpus=2)
    assert (plan.device.value, plan.backend, plan.num_processes) == ("cuda", "nccl", 2)
    plan = plan_for(["--gpu_ids", "1", "train.py"], gpus=2)
    assert plan.num_processes == 1 and plan.worker_env["CUDA_VISIBLE_DEVICES"] == "1"
    with pytest.raises(LaunchPlanError, match="only 2 are usable"):
        plan_for(["--num_processes", "3", "train.py"], gpus=2)


def test_static_multi_machine_arguments(workdir):
    plan = plan_for(
        ["--num_machines", "2", "--machine_rank", "1", "--num_processes", "4", "--main_process_ip", "127.0.0.1",
         "--main_process_port", "29611", "train.py"]
    )  # fmt: skip
    args = plan.torchrun_args
    assert plan.nproc_per_node == 2
    for flag, value in [("--nnodes", "2"), ("--node_rank", "1"), ("--master_addr", "127.0.0.1"),
                        ("--master_port", "29611"), ("--rdzv_backend", "static")]:  # fmt: skip
        assert args[args.index(flag) + 1] == value


def test_c10d_rendezvous_arguments(workdir):
    plan = plan_for(
        ["--num_machines", "2", "--num_processes", "2", "--rdzv_backend", "c10d", "--main_process_ip",
         "127.0.0.1", "--main_process_port", "29612", "--rdzv_conf", "timeout=60", "train.py"]
    )  # fmt: skip
    args = plan.torchrun_args
    assert args[args.index("--rdzv_endpoint") + 1] == "127.0.0.1:29612"
    conf = dict(item.split("=") for item in args[args.index("--rdzv_conf") + 1].split(","))
    # The main IP is local here, so this machine hosts the rendezvous store.
    assert conf == {"timeout": "60", "is_host": "1"}


def test_fsdp_and_deepspeed_settings_are_passed_through(workdir):
    plan = plan_for(["--use_fsdp", "--num_processes", "2", "--fsdp_version", "2",
                     "--fsdp_offload_params", "true", "train.py"])  # fmt: skip
    record = json.loads(plan.worker_env[LAUNCH_CONFIG_ENV])
    assert record["distributed_type"] == "FSDP"
    assert record["fsdp"]["version"] == 2 and record["fsdp"]["offload_params"] is True
    config = write_config(workdir / "ds.yaml", distributed_type="DEEPSPEED", use_cpu=False, num_processes=2,
                          deepspeed_config={"zero_stage": 3, "gradient_accumulation_steps": 4})  # fmt: skip
    record = json.loads(
        plan_for(["--config_file", str(config), "train.py"]).worker_env[LAUNCH_CONFIG_ENV]
    )
    assert record["deepspeed"]["zero_stage"] == 3
    assert "zero_stage" in record["deepspeed"]["fields_from_config"]


@pytest.mark.parametrize(
    "argv, fragment",
    [
        (["--cpu", "--multi_gpu"], "cannot be used together"),
        (["--use_fsdp", "--use_deepspeed"], "cannot be used together"),
        (["--module", "--no_python"], "--module and --no_python"),
        (["--num_processes", "0"], "at least 1"),
        (
            ["--num_processes", "3", "--num_machines", "2", "--main_process_ip", "1.2.3.4"],
            "divisible",
        ),
        (["--num_machines", "2", "--num_processes", "2"], "--main_process_ip is required"),
        (
            ["--num_machines", "2", "--machine_rank", "2", "--main_process_ip", "1.2.3.4"],
            "machine_rank 2",
        ),
        (["--main_process_port", "70000"], "not a TCP port"),
        (["--rdzv_backend", "zookeeper"], "must be one of"),
        (["--rdzv_conf", "oops"], "key=value"),
        (["--tee", "9"], "--tee"),
        (["--fsdp_offload_params", "true"], "only applies with --use_fsdp"),
        (["--zero_stage", "2"], "only applies with --use_deepspeed"),
        (["--dynamo_mode", "max-autotune"], "needs --dynamo_backend"),
        (["--use_deepspeed", "--zero_stage", "5"], "zero_stage"),
        (["--max_restarts", "-1"], "max_restarts"),
    ],
)
def test_contradictory_or_invalid_flags_are_refused(workdir, argv, fragment):
    with pytest.raises(LaunchPlanError, match=fragment):
        plan_for([*argv, "train.py"])


def test_all_problems_are_reported_at_once(workdir):
    with pytest.raises(LaunchPlanError) as err:
        plan_for(["--num_processes", "0", "--tee", "9", "missing.py"])
    message = str(err.value)
    assert "at least 1" in message and "--tee" in message and "missing.py" in message


def test_port_already_in_use_is_refused(workdir):
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        busy = listener.getsockname()[1]
        with pytest.raises(LaunchPlanError, match=f"port {busy} \\(flag\\) is already in use"):
            plan_for(["--num_processes", "2", "--main_process_port", str(busy), "train.py"])


def test_free_port_is_chosen_when_none_or_zero_is_given(workdir):
    for argv in ([], ["--main_process_port", "0"]):
        setting = plan_for([*argv, "--num_processes", "2", "train.py"]).settings[
            "main_process_port"
        ]
        assert 0 < setting.value < 65536 and "free port" in setting.source


def test_bad_environment_value_is_named(workdir):
    with pytest.raises(LaunchPlanError, match="CADENCE_NUM_PROCESSES='many'"):
        plan_for(["train.py"], {"CADENCE_NUM_PROCESSES": "many"})


def run_cli(args, cwd, env=None):
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("CADENCE_")}
    full_env["HF_HOME"] = str(cwd / "hf")
    full_env.update(env or {})
    return subprocess.run(
        [*CADENCE, *args], cwd=cwd, env=full_env, capture_output=True, text=True, timeout=60
    )


def test_dry_run_through_cli_shows_plan_sources_and_command(workdir):
    config = write_config(workdir / "c.yaml", num_processes=3, mixed_precision="fp16")
    result = run_cli(
        [
            "launch",
            "--dry_run",
            "--config_file",
            str(config),
            "--num_processes",
            "2",
            "train.py",
            "--epochs",
            "1",
        ],
        workdir,
        env={"CADENCE_MIXED_PRECISION": "bf16"},
    )
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "processes" in out and "[flag]" in out
    assert "bf16" in out and "[env CADENCE_MIXED_PRECISION]" in out
    assert "cadence.launch.worker_bootstrap train.py --epochs 1" in out
    assert "torch.distributed.run" in out and "--nproc_per_node 2" in out


@pytest.mark.parametrize(
    "argv, fragment",
    [
        (["--num_procs", "2", "train.py"], "did you mean --num_processes"),
        (["--megatron_lm_tp_degree", "2", "train.py"], "Megatron-LM is not supported"),
        (["--mixed_precision", "fp32", "train.py"], "invalid choice"),
        (["--cpu", "--use_fsdp", "train.py"], "cannot be used together"),
        (["--config_file", "nope.yaml", "train.py"], "does not exist"),
    ],
)
def test_bad_command_lines_fail_before_starting(workdir, argv, fragment):
    marker = workdir / "started"
    (workdir / "train.py").write_text(f"open({str(marker)!r}, 'w').close()\n")
    result = run_cli(["launch", *argv], workdir)
    assert result.returncode == 2
    assert fragment in result.stderr
    assert not marker.exists()


def test_hyphenated_flags_work_like_underscored_ones(workdir):
    plan = plan_for(["--num-processes", "2", "--mixed-precision", "bf16", "train.py"])
    assert plan.num_processes == 2 and plan.value("mixed_precision") == "bf16"
