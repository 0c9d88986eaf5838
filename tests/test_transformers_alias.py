"""transformers' Trainer, peft, TRL and diffusers on Cadence through the `accelerate` alias
(CADENCE_AS_ACCELERATE=1): the case scripts of compat/cases, each in a subprocess, tiny models built
from configs, no network. They skip when the libraries are not installed (the `test` extra pins them).
"""

from __future__ import annotations

import math
import sys

import pytest
from alias_support import CADENCE, needs, run_case

pytest.importorskip("transformers")


def test_trainer_accumulation_resume_evaluate_checkpointing_lora_and_device_maps(tmp_path):
    needs("peft")
    out = run_case(tmp_path, "trainer_cases.py")
    assert out["accelerate_available"] is True and out["accelerate_version"] == "1.15.0"
    assert out["global_step"] == 6 and out["train_loss_finite"]
    # resuming from the checkpoint of step 3 ends where the uninterrupted run ended, bit for bit
    assert out["resumed"] == out["accumulation"]
    assert out["eval_loss_matches"] and out["predict_matches"]
    # recomputing activations changes nothing in the result (no dropout)
    assert out["gradient_checkpointing"] == out["accumulation"]
    assert out["lora_b_trained"] and out["lora_base_frozen"]
    loads = ("auto", "sequential", "cpu_disk_offload", "sequential_offload", "low_cpu_mem_usage")
    for name in (*loads, "cpu_map"):
        assert out[f"load_{name}"]["equal"], name
    # 80KB of CPU for a ~110KB model: the embeddings stay in memory, the blocks go to disk
    assert out["load_cpu_disk_offload"]["devices"] == ["cpu", "disk"]
    assert out["load_sequential_offload"]["devices"] == ["cpu", "disk"]


def test_trl_sft_trainer_and_its_resume(tmp_path):
    needs("trl")
    pytest.importorskip("datasets")
    out = run_case(tmp_path, "trl_cases.py")
    assert out["global_step"] == 4
    assert out["sft_resumed"] == out["sft"]


def test_diffusers_unconditional_loop_with_ema_hooks_and_resume(tmp_path):
    needs("diffusers")
    out = run_case(tmp_path, "diffusers_cases.py")
    assert out["unet_resumed"] == out["unet"]
    assert out["ema_resumed"] == out["ema"]
    assert out["ema"] != out["unet"]  # the EMA really is a separate average
    assert out["reloaded"] == out["unet"]  # from_pretrained(low_cpu_mem_usage=True) of the result


def test_trainer_on_two_processes_cadence_launch_equals_torchrun(tmp_path):
    launched = run_case(
        tmp_path / "cadence",
        "trainer_ddp.py",
        launcher=[*CADENCE, "launch", "--cpu", "--num_processes", "2", "--as-accelerate"],
    )
    torchrun = run_case(
        tmp_path / "torchrun",
        "trainer_ddp.py",
        launcher=[sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2"],
    )
    single = run_case(tmp_path / "single", "trainer_ddp.py")
    assert launched["world_size"] == torchrun["world_size"] == 2 and single["world_size"] == 1
    assert launched["map"] == torchrun["map"]
    assert launched["iterable"] == torchrun["iterable"]  # batches dispatched from rank 0
    # the same global batch of 8 on 1 process: the same training up to summation order
    for kind in ("map_weights", "iterable_weights"):
        for a, b in zip(launched[kind], single[kind], strict=True):
            assert math.isclose(a, b, rel_tol=1e-4, abs_tol=1e-5), kind
