"""`cadence estimate-memory` (a local config folder, no network) and `cadence to-fsdp2`, through a
real subprocess."""

from __future__ import annotations

import subprocess

import pytest
import yaml
from alias_support import CADENCE, alias_env


def cadence(tmp_path, *args):
    return subprocess.run(
        [*CADENCE, *args],
        cwd=tmp_path,
        env=alias_env(tmp_path, alias=False),
        capture_output=True,
        text=True,
        timeout=240,
    )


def test_estimate_memory_of_a_local_config_folder(tmp_path):
    transformers = pytest.importorskip("transformers")
    config = transformers.GPT2Config(
        n_layer=2,
        n_embd=32,
        n_head=2,
        vocab_size=64,
        n_positions=32,
        bos_token_id=0,
        eos_token_id=0,
    )
    config.save_pretrained(tmp_path / "tiny")
    params = sum(p.numel() for p in transformers.GPT2LMHeadModel(config).parameters())
    done = cadence(
        tmp_path, "estimate-memory", str(tmp_path / "tiny"), "--dtypes", "float32", "int4"
    )
    assert done.returncode == 0, done.stderr[-3000:]
    rows = {
        cells[0]: cells[1:]
        for line in done.stdout.splitlines()
        if line.startswith("│") and (cells := [c.strip() for c in line.strip("│").split("│")])
    }
    assert f"Memory Usage for loading `{tmp_path / 'tiny'}`" in done.stdout
    rows = {dtype: cells for dtype, cells in rows.items() if dtype in ("float32", "int4")}
    assert set(rows) == {"float32", "int4"} and "│  int8 │" not in done.stdout
    # fp32: 4 bytes per parameter (tied embeddings once); int4: an eighth of that; Adam: 4x fp32
    assert rows["float32"][1] == f"{round(params * 4 / 1024, 2)} KB"
    assert rows["int4"][1] == f"{round(params * 4 / 8 / 1024, 2)} KB"
    assert rows["float32"][2] == f"{round(params * 16 / 1024, 2)} KB"


def test_to_fsdp2_converts_an_fsdp1_config(tmp_path):
    source = tmp_path / "fsdp1.yaml"
    source.write_text(
        yaml.safe_dump(
            {
                "distributed_type": "FSDP",
                "fsdp_config": {
                    "fsdp_sharding_strategy": "SHARD_GRAD_OP",
                    "fsdp_backward_prefetch": "BACKWARD_PRE",
                    "fsdp_use_orig_params": True,
                    "fsdp_offload_params": False,
                },
            }
        )
    )
    target = tmp_path / "fsdp2.yaml"
    done = cadence(tmp_path, "to-fsdp2", "--config-file", str(source), "--output-file", str(target))
    assert done.returncode == 0, done.stderr[-3000:]
    converted = yaml.safe_load(target.read_text())
    assert converted["fsdp_config"] == {
        "fsdp_version": 2,
        "fsdp_reshard_after_forward": False,  # SHARD_GRAD_OP keeps parameters after forward
        "fsdp_offload_params": False,
    }
    refused = cadence(
        tmp_path, "to-fsdp2", "--config_file", str(source), "--output_file", str(target)
    )
    assert refused.returncode != 0 and "already exists" in refused.stderr
