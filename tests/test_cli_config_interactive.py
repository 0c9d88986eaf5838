"""`cadence config` driven like a person would: arrow-key menus in a pseudo-terminal, and piped answers."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import yaml

from cadence.launch.config_file import load_config_from_file

pexpect = pytest.importorskip("pexpect")
pytest.importorskip("questionary")

CADENCE = [sys.executable, "-m", "cadence.commands.cli"]
UP, DOWN, CLEAR_LINE = "\x1b[A", "\x1b[B", "\x15"


def clean_env(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("CADENCE_")}
    env.update(
        HF_HOME=str(tmp_path / "hf"),
        TERM="xterm",
        CUDA_VISIBLE_DEVICES="",
        PROMPT_TOOLKIT_NO_CPR="1",
    )
    return env


def test_menus_in_a_terminal_write_the_chosen_config(tmp_path):
    target = tmp_path / "chosen.yaml"
    child = pexpect.spawn(
        sys.executable,
        [*CADENCE[1:], "config", "--config_file", str(target)],
        env=clean_env(tmp_path),
        encoding="utf-8",
        timeout=30,
        dimensions=(40, 200),
    )
    try:
        child.expect("compute environment")
        child.send("\r")  # This machine (the default)
        child.expect("type of machine")
        child.send(DOWN + "\r")  # multi-CPU
        child.expect("How many machines")
        child.send("\r")  # 1
        child.expect("Check distributed operations")
        child.send("n")
        child.expect("torch dynamo")
        child.send("y")
        child.expect("Which dynamo backend")
        child.send(UP + "\r")  # aot_eager, just above the default (inductor)
        child.expect("customize")
        child.send("n")
        child.expect("FullyShardedDataParallel")
        child.send("n")
        child.expect("How many processes")
        child.send(CLEAR_LINE + "1\r")  # refused: one process is not multi-CPU
        child.expect("at least 2")
        child.send(CLEAR_LINE + "3\r")
        child.expect("mixed precision")
        child.send(DOWN + DOWN + "\r")  # no, fp16, bf16
        child.expect("configuration saved at")
        child.expect(pexpect.EOF)
    finally:
        child.close()
    assert child.exitstatus == 0
    written = yaml.safe_load(target.read_text())
    assert written["distributed_type"] == "MULTI_CPU"
    assert written["num_processes"] == 3 and written["use_cpu"] is True
    assert written["mixed_precision"] == "bf16"
    assert written["dynamo_config"] == {"dynamo_backend": "AOT_EAGER"}
    load_config_from_file(target)  # and `cadence launch` can read it


def test_answers_can_be_piped_without_a_terminal(tmp_path):
    answers = "\n".join(
        [
            "1",  # This machine
            "1",  # No distributed training
            "",  # CPU only? default yes on a machine without GPU
            "n",  # dynamo
            "no",  # DeepSpeed? (asked only when not CPU; extra answers are harmless)
            "",
        ]
    )
    result = subprocess.run(
        [*CADENCE, "config"],
        input=answers,
        env=clean_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    written = yaml.safe_load((tmp_path / "hf" / "cadence" / "default_config.yaml").read_text())
    assert written["distributed_type"] == "NO" and written["use_cpu"] is True


def test_input_ending_early_writes_nothing(tmp_path):
    result = subprocess.run(
        [*CADENCE, "config"],
        input="1\n",
        env=clean_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 1 and "Nothing was written" in result.stderr
    assert not (tmp_path / "hf" / "cadence" / "default_config.yaml").exists()
