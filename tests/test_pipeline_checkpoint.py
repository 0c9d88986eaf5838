"""Pipeline-parallel checkpoints on real gloo processes: each stage writes its own part of save_state,
which resumes exactly on the same split, on another schedule's split and on another pp size; the
stages' parts merge into the whole model; a model built on the meta device gets memory for its own
stages only and, loaded from a checkpoint, trains on as one process does."""

from __future__ import annotations

import pytest
import torch
from pipeline_helpers import (
    llama_batches,
    loss_fn,
    make_llama,
    make_model,
    make_optimizer,
    make_scheduler,
    prepare_pipeline,
    reference,
    train_steps,
)


def save_then_resume(folder, pp_size, schedule, resume_pp_size, resume_schedule):
    """2 steps, save_state (each stage writes its own part), 2 steps; then a fresh Accelerator on
    `resume_pp_size` loads the state and trains the same 2 steps."""
    import torch.distributed as dist

    from cadence.state import reset_state

    acc, objects = prepare_pipeline(pp_size, schedule)
    train_steps(acc, objects, 0, 2)
    acc.save_state(folder)
    train_steps(acc, objects, 2, 2)
    straight = acc.get_state_dict(objects[0])
    acc.save_model(objects[0], folder + "-model")  # the whole model's safetensors, from every stage
    reset_state()
    dist.barrier()
    acc, objects = prepare_pipeline(resume_pp_size, resume_schedule)
    acc.load_state(folder)
    train_steps(acc, objects, 2, 2)
    return straight, acc.get_state_dict(objects[0])


@pytest.mark.parametrize(
    "resume", [("1F1B", 2, "1F1B"), ("GPipe", 2, "Interleaved1F1B")], ids=["same", "resplit"]
)
def test_save_state_per_stage_and_resume(dist_pool, tmp_path, resume):
    schedule, resume_pp, resume_schedule = resume
    results = dist_pool(2).run(
        save_then_resume,
        str(tmp_path / "ckpt"),
        2,
        schedule,
        resume_pp,
        resume_schedule,
        timeout=180,
    )
    straight, resumed = results[0]
    _, weights, _ = reference(4)
    from safetensors.torch import load_file

    saved_model = load_file(str(tmp_path / "ckpt-model" / "model.safetensors"))
    for state in (straight, resumed, saved_model):
        assert sorted(state) == sorted(weights)
        assert max((state[k] - weights[k]).abs().max().item() for k in weights) < 1e-5
    # the stages' parts of the checkpoint merge into the whole model as it was after 2 steps
    from cadence.checkpointing.merge import merge_fsdp_weights

    merge_fsdp_weights(str(tmp_path / "ckpt" / "pytorch_model_fsdp_0"), str(tmp_path / "merged"))
    merged = load_file(str(tmp_path / "merged" / "model.safetensors"))
    _, after_two, _ = reference(2)
    assert sorted(merged) == sorted(after_two)
    assert max((merged[k] - after_two[k]).abs().max().item() for k in after_two) < 1e-5


def meta_model_loads_a_checkpoint(folder):
    """A model built with init_empty_weights gets real weights for this process's stages only; after
    load_state of a checkpoint written after 2 steps it trains on as one process does."""
    import torch.distributed as dist

    from cadence import init_empty_weights
    from cadence.state import reset_state

    acc, objects = prepare_pipeline(2)
    train_steps(acc, objects, 0, 2)
    acc.save_state(folder)
    reset_state()
    dist.barrier()
    from cadence import Accelerator
    from cadence.plugins import ParallelismConfig, PipelineParallelConfig

    config = ParallelismConfig(pp_size=2, pp_handler=PipelineParallelConfig(loss_fn=loss_fn))
    acc = Accelerator(parallelism_config=config)
    with init_empty_weights():
        model = make_model()
    optimizer = make_optimizer(model)  # built on the meta parameters, as a script would
    whole = sum(p.numel() for p in model.parameters())
    objects = acc.prepare(model, optimizer, make_scheduler(optimizer))
    model, optimizer, _ = objects
    real = sum(p.numel() for p in model.parameters() if not p.is_meta)
    in_optimizer = sum(p.numel() for g in optimizer.param_groups for p in g["params"])
    acc.load_state(folder)
    train_steps(acc, objects, 2, 2)
    return whole, real, in_optimizer, acc.get_state_dict(model)


def test_a_meta_device_model_builds_only_its_stages(dist_pool, tmp_path):
    results = dist_pool(2).run(meta_model_loads_a_checkpoint, str(tmp_path / "init"), timeout=180)
    _, weights, _ = reference(4)
    for whole, real, in_optimizer, _ in results:
        assert real == in_optimizer < whole  # this rank's stages only, and the optimizer follows
    assert results[0][1] + results[1][1] == results[0][0]
    state = results[0][3]
    assert max((state[k] - weights[k]).abs().max().item() for k in weights) < 1e-5


def meta_llama_trains():
    from cadence import Accelerator, init_empty_weights
    from cadence.plugins import ParallelismConfig

    acc = Accelerator(parallelism_config=ParallelismConfig(pp_size=2))
    with init_empty_weights(include_buffers=True):  # the rotary frequencies on meta too
        model = make_llama()
    optimizer = make_optimizer(model)
    model, optimizer = acc.prepare(model, optimizer)
    ids = llama_batches(1)[0]
    losses = []
    for _ in range(2):
        loss = model(input_ids=ids, labels=ids).loss
        acc.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return losses, any(p.is_meta for p in model.parameters())


def test_a_meta_device_llama_is_initialized_per_stage(dist_pool):
    pytest.importorskip("transformers")
    results = dist_pool(2).run(meta_llama_trains, timeout=180)
    for losses, meta in results:
        assert not meta and losses == results[0][0]
        # a fresh initialization predicts about uniformly over the 64 tokens, then learns
        assert abs(losses[0] - torch.log(torch.tensor(64.0)).item()) < 0.2 and losses[1] < losses[0]


def save_sequential(folder):
    acc, objects = prepare_pipeline(2, kind="sequential")
    train_steps(acc, objects, 0, 2)
    acc.save_state(folder)


def resume_sequential(folder):
    acc, objects = prepare_pipeline(4, kind="sequential")
    acc.load_state(folder)
    train_steps(acc, objects, 2, 2)
    return acc.get_state_dict(objects[0])


def test_resume_on_another_pp_size(dist_pool, tmp_path):
    """Saved by pp 2 on 2 processes, loaded by pp 4 on 4: each stage reads its own parameters."""
    folder = str(tmp_path / "ckpt")
    dist_pool(2).run(save_sequential, folder, timeout=120)
    state = dist_pool(4).run(resume_sequential, folder, timeout=120)[0]
    _, weights, _ = reference(4, kind="sequential")
    assert max((state[k] - weights[k]).abs().max().item() for k in weights) < 1e-5


def save_before_the_first_step(folder):
    """save_state before any optimizer step, 2 steps; then a fresh run loads it and trains 2 steps."""
    import torch.distributed as dist

    from cadence.state import reset_state

    acc, objects = prepare_pipeline(2)
    acc.save_state(folder)
    train_steps(acc, objects, 0, 2)
    straight = acc.get_state_dict(objects[0])
    reset_state()
    dist.barrier()
    acc, objects = prepare_pipeline(2)
    acc.load_state(folder)
    train_steps(acc, objects, 0, 2)
    return straight, acc.get_state_dict(objects[0])


def test_a_save_before_the_first_step_changes_nothing(dist_pool, tmp_path):
    """torch initialises a fresh optimizer's state with a step of its own when its state dict is
    taken: neither the saving run nor the resumed one may count it (AdamW's bias correction)."""
    straight, resumed = dist_pool(2).run(save_before_the_first_step, str(tmp_path / "c"))[0]
    _, weights, _ = reference(2)
    for state in (straight, resumed):
        assert max((state[k] - weights[k]).abs().max().item() for k in weights) < 1e-5
