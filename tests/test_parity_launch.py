"""`_validate_launch_command`, the reference's private launcher step that some scripts call: the flags,
the environment and the config file are merged onto the parsed arguments, as `cadence launch` does."""

from __future__ import annotations

import pytest


def test_flags_win_over_the_config_file_which_fills_the_rest(tmp_path, monkeypatch):
    from cadence.commands.launch import _validate_launch_command, launch_command_parser

    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text("print('hello')\n")
    (tmp_path / "config.yaml").write_text(
        "compute_environment: LOCAL_MACHINE\ndebug: true\nnum_processes: 1\n"
        "mixed_precision: bf16\ndistributed_type: 'NO'\n"
    )
    argv = ["--num-processes", "2", "--cpu", "--config-file", "config.yaml", "train.py"]
    args = launch_command_parser().parse_args(argv)
    args, config, mixed_precision_from_config = _validate_launch_command(args)
    assert args.num_processes == 2  # the flag
    assert args.debug is True and args.mixed_precision == "bf16"  # the config file
    assert mixed_precision_from_config is True
    assert config.mixed_precision == "bf16"


def test_fsdp_sync_module_states_reads_true_until_the_config_file_says_otherwise(
    tmp_path, monkeypatch
):
    """Accelerate's parser defaults `--fsdp_sync_module_states` to "true" in the raw namespace; the
    config file's value replaces it once the command is validated, a typed flag wins over both."""
    from cadence.commands.launch import _validate_launch_command, launch_command_parser

    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text("print('hello')\n")
    (tmp_path / "config.yaml").write_text(
        "compute_environment: LOCAL_MACHINE\nnum_processes: 1\ndistributed_type: 'NO'\n"
        "fsdp_config:\n  fsdp_sync_module_states: false\n"
    )
    args = launch_command_parser().parse_args(["--config-file", "config.yaml", "train.py"])
    assert args.fsdp_sync_module_states == "true" and "fsdp_sync_module_states" not in vars(args)
    args, _, _ = _validate_launch_command(args)
    assert args.fsdp_sync_module_states is False
    argv = ["--fsdp_sync_module_states", "false", "train.py"]
    assert launch_command_parser().parse_args(argv).fsdp_sync_module_states is False


def test_an_invalid_launch_lists_its_problems(tmp_path, monkeypatch):
    from cadence.commands.launch import _validate_launch_command, launch_command_parser
    from cadence.launch.plan import LaunchPlanError

    monkeypatch.chdir(tmp_path)
    args = launch_command_parser().parse_args(["--cpu", "missing.py"])
    with pytest.raises(LaunchPlanError, match="does not exist"):
        _validate_launch_command(args)


def test_launch_command_raises_value_error_for_a_bad_config_and_the_cli_exits_2(tmp_path):
    import subprocess
    import sys

    from cadence.commands.launch import launch_command, launch_command_parser

    script = tmp_path / "train.py"
    script.write_text("print('hello')\n")
    config = tmp_path / "bad.yaml"
    config.write_text(
        "compute_environment: LOCAL_MACHINE\ndistributed_type: 'NO'\nnum_processes: 1\n"
        "invalid_key: 1\nanother_invalid_key: 2\n"
    )
    args = launch_command_parser().parse_args(["--config_file", str(config), str(script)])
    with pytest.raises(ValueError, match="another_invalid_key"):
        launch_command(args)
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "cadence.commands.cli",
            "launch",
            "--config_file",
            str(config),
            str(script),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2
    assert "invalid_key" in done.stderr and "hello" not in done.stdout


def test_standalone_parser_answers_for_flags_that_were_not_typed():
    from cadence.commands.launch import launch_command_parser

    parser = launch_command_parser()
    args = parser.parse_args(["--config-file", "test.yaml", "test.py"])
    assert args.config_file == "test.yaml"
    assert args.multi_gpu is False and args.use_fsdp is False  # on/off flags read as off
    assert args.num_processes is None
    assert "multi_gpu" not in vars(args)  # only typed flags are stored (what the plan reads)
    args = parser.parse_args(["--multi-gpu", "--use_deepspeed", "--num-processes", "4", "test.py"])
    assert (args.multi_gpu, args.use_deepspeed, args.num_processes) == (True, True, 4)
    with pytest.raises(AttributeError):
        _ = args.not_a_flag


def test_a_dry_run_through_the_standalone_parser(tmp_path, monkeypatch, capsys):
    from cadence.commands.launch import launch_command, launch_command_parser

    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text("print('hello')\n")
    args = launch_command_parser().parse_args(["--cpu", "--dry_run", "train.py"])
    assert launch_command(args) == 0
    assert "train.py" in capsys.readouterr().out
