"""`cadence tpu-config`: the gcloud command that runs setup commands on every worker of a TPU pod.

Through the real CLI (a subprocess) with `--debug`, which prints the command instead of running it;
the expected lines follow the documented form `gcloud compute tpus tpu-vm ssh <name> --zone <zone>
--command "cd /usr/share; <commands>" --worker all`.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

GCLOUD = "Running gcloud compute tpus tpu-vm ssh"


def run_cli(*args: str, cwd, home) -> subprocess.CompletedProcess:
    env = dict(os.environ, HF_HOME=str(home), CADENCE_CONFIG_DIR=str(home))
    return subprocess.run(
        [sys.executable, "-m", "cadence.commands.cli", "tpu-config", *args],
        capture_output=True, text=True, cwd=cwd, env=env, timeout=120,
    )  # fmt: skip


@pytest.fixture
def pod_config(tmp_path):
    commands = tmp_path / "setup.sh"
    commands.write_text('echo "hello world"\n\necho "second command"\n')
    config = tmp_path / "pod.yaml"
    config.write_text(
        "compute_environment: LOCAL_MACHINE\ndistributed_type: 'NO'\nmixed_precision: 'no'\n"
        f"num_machines: 1\nnum_processes: 1\nuse_cpu: false\ntpu_name: test-tpu\n"
        f"tpu_zone: us-central1-a\ncommands: null\ncommand_file: {commands}\n"
    )
    return config


def test_flags_only(tmp_path):
    result = run_cli(
        "--command", "ls", "--tpu_zone", "us-central1-a", "--tpu_name", "test-tpu", "--debug",
        cwd=tmp_path, home=tmp_path,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == (
        f"{GCLOUD} test-tpu --zone us-central1-a --command cd /usr/share; ls --worker all"
    )


def test_config_file_commands_flags_and_install(tmp_path, pod_config):
    expected_file = 'cd /usr/share; echo "hello world"; echo "second command" --worker all'
    result = run_cli("--config_file", str(pod_config), "--debug", cwd=tmp_path, home=tmp_path)
    assert (
        result.stdout.strip() == f"{GCLOUD} test-tpu --zone us-central1-a --command {expected_file}"
    )
    # --command wins over the config file's command_file; several --command run in order.
    result = run_cli(
        "--config_file", str(pod_config), "--command", "ls", "--command", 'echo "Hi"', "--debug",
        cwd=tmp_path, home=tmp_path,
    )  # fmt: skip
    assert 'cd /usr/share; ls; echo "Hi" --worker all' in result.stdout
    result = run_cli(
        "--config_file", str(pod_config), "--install_accelerate", "--accelerate_version", "0.1.0",
        "--use_alpha", "--debug", cwd=tmp_path, home=tmp_path,
    )  # fmt: skip
    assert result.stdout.strip().startswith("Running gcloud alpha compute tpus tpu-vm ssh test-tpu")
    assert "--command cd /usr/share; pip install cadence==0.1.0; echo" in result.stdout
    # the same flags under Cadence's name (a command switched by renaming accelerate to cadence)
    renamed = run_cli(
        "--config_file", str(pod_config), "--install_cadence", "--cadence_version", "0.1.0",
        "--use_alpha", "--debug", cwd=tmp_path, home=tmp_path,
    )  # fmt: skip
    assert renamed.stdout == result.stdout


def test_missing_command_name_or_zone_is_a_clear_error(tmp_path):
    result = run_cli("--tpu_name", "x", "--debug", cwd=tmp_path, home=tmp_path)
    assert result.returncode == 2
    assert "You must specify either a command file or a command to run on the pod" in result.stderr
    assert "No TPU zone" in result.stderr
    assert "Traceback" not in result.stderr


def test_without_gcloud_says_what_to_install(tmp_path):
    from cadence.commands.tpu import tpu_command_launcher, tpu_command_parser

    args = tpu_command_parser().parse_args(
        ["--tpu_name", "pod", "--tpu_zone", "z", "--command", "ls"]
    )
    saved = os.environ["PATH"]
    os.environ["PATH"] = str(tmp_path)  # no gcloud here
    try:
        with pytest.raises(FileNotFoundError, match="Google Cloud SDK"):
            tpu_command_launcher(args)
    finally:
        os.environ["PATH"] = saved
