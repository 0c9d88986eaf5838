"""Parity with the reference (issue 12): collectives on tensors that require grad, unwrap_model of
DataParallel / DDP inside torch.compile, and the device chosen by CADENCE_TORCH_DEVICE /
ACCELERATE_TORCH_DEVICE. Multi-process behaviour runs on 2 real gloo processes (tests/harness.py)."""

from __future__ import annotations

import pytest
import torch


# -- gather of a tensor that requires grad -----------------------------------------------------
def gather_loss_with_grad():
    from cadence import Accelerator

    acc = Accelerator(cpu=True)
    weight = torch.ones(2, requires_grad=True)
    loss = (weight * (acc.process_index + 1)).sum()  # rank r: 2 * (r + 1), part of a graph
    per_sample = weight * (acc.process_index + 1)
    gathered = acc.gather(loss)
    for_metrics = acc.gather_for_metrics(loss)
    gathered_vector = acc.gather(per_sample)
    reduced = acc.reduce(loss)  # Accelerator.reduce sums by default
    padded = acc.pad_across_processes(per_sample)
    # The graph of the rank's own loss is intact: backward still works after gathering.
    loss.backward()
    return {
        "gather": gathered.tolist(),
        "gather_requires_grad": gathered.requires_grad,
        "for_metrics": for_metrics.tolist(),
        "vector": gathered_vector.tolist(),
        "local_grad": weight.grad.tolist(),
        "reduced": reduced.item(),
        "padded": padded.tolist(),
    }


def test_gather_of_a_tensor_that_requires_grad(dist_pool):
    results = dist_pool(2).run(gather_loss_with_grad)
    for rank, result in enumerate(results):
        # Every rank gets every rank's value, in rank order (0-d tensors become 1-d), without the
        # autograd history of the other ranks (gathered values are data, as in the reference).
        assert result["gather"] == [2.0, 4.0]
        assert result["gather_requires_grad"] is False
        assert result["for_metrics"] == [2.0, 4.0]
        assert result["vector"] == [1.0, 1.0, 2.0, 2.0]
        assert result["local_grad"] == [rank + 1.0, rank + 1.0]
        assert result["reduced"] == 2.0 + 4.0
        assert result["padded"] == [rank + 1.0, rank + 1.0]  # same sizes: nothing to pad


# -- unwrap_model --------------------------------------------------------------------------------
def unwrap_compiled_ddp():
    from cadence import Accelerator

    acc = Accelerator(cpu=True)
    inner = torch.nn.Linear(2, 2)
    prepared = acc.prepare(inner)  # DDP on two processes
    is_ddp = isinstance(prepared, torch.nn.parallel.DistributedDataParallel)
    compiled = torch.compile(prepared)  # compiled lazily: nothing is traced here
    stripped = acc.unwrap_model(compiled, keep_torch_compile=False)
    kept = acc.unwrap_model(compiled, keep_torch_compile=True)
    return {
        "is_ddp": is_ddp,
        "stripped_is_inner": stripped is inner,
        "kept_type": type(kept).__name__,
        "kept_wraps_inner": getattr(kept, "_orig_mod", None) is inner,
        "plain_ddp": acc.unwrap_model(prepared) is inner,
        "flag": getattr(prepared, "_is_accelerator_prepared", None),
    }


def test_unwrap_model_strips_ddp_inside_torch_compile(dist_pool):
    for result in dist_pool(2).run(unwrap_compiled_ddp):
        assert result == {
            "is_ddp": True,
            "stripped_is_inner": True,
            "kept_type": "OptimizedModule",
            "kept_wraps_inner": True,
            "plain_ddp": True,
            "flag": True,
        }


@pytest.mark.parametrize("keep_torch_compile", [True, False])
def test_unwrap_model_strips_data_parallel(keep_torch_compile):
    from cadence import Accelerator

    acc = Accelerator(cpu=True)
    inner = torch.nn.Linear(2, 2)
    data_parallel = torch.nn.DataParallel(inner)
    assert acc.unwrap_model(data_parallel, keep_torch_compile=keep_torch_compile) is inner
    unwrapped = acc.unwrap_model(
        torch.compile(data_parallel), keep_torch_compile=keep_torch_compile
    )
    if keep_torch_compile:  # the compiled wrapper stays, around the user's module
        assert type(unwrapped).__name__ == "OptimizedModule"
        assert unwrapped._orig_mod is inner
    else:
        assert unwrapped is inner


# -- the device chosen by the environment ------------------------------------------------------
def device_and_parameters():
    from cadence import Accelerator, PartialState

    acc = Accelerator(cpu=True)
    model = acc.prepare(torch.nn.Linear(1, 1))
    return str(acc.device), str(PartialState().device), next(model.parameters()).device.type


def test_torch_device_variables_choose_the_device_on_every_rank(dist_pool):
    pool = dist_pool(2)
    # Without a variable several CPU processes report cpu:0, as the reference does.
    assert pool.run(device_and_parameters) == [("cpu:0", "cpu:0", "cpu")] * 2
    chosen = pool.run(device_and_parameters, env={"ACCELERATE_TORCH_DEVICE": "cpu"})
    assert chosen == [("cpu", "cpu", "cpu")] * 2
    # Cadence's own name wins over the reference's.
    both = {"CADENCE_TORCH_DEVICE": "cpu:0", "ACCELERATE_TORCH_DEVICE": "cpu"}
    assert pool.run(device_and_parameters, env=both) == [("cpu:0", "cpu:0", "cpu")] * 2


@pytest.mark.parametrize("variable", ["ACCELERATE_TORCH_DEVICE", "CADENCE_TORCH_DEVICE"])
def test_torch_device_variable_overrides_cpu_true(monkeypatch, variable):
    # The reference takes the variable's device even with cpu=True: a meta device proves it.
    monkeypatch.setenv(variable, "meta")
    assert device_and_parameters() == ("meta", "meta", "meta")


def test_a_bad_torch_device_variable_is_a_clear_error(monkeypatch):
    from cadence import Accelerator

    monkeypatch.setenv("ACCELERATE_TORCH_DEVICE", "not-a-device")
    with pytest.raises(ValueError, match="ACCELERATE_TORCH_DEVICE='not-a-device' is not a torch"):
        Accelerator(cpu=True)
    monkeypatch.delenv("ACCELERATE_TORCH_DEVICE")
    # Nothing was half set up: the next Accelerator starts cleanly.
    assert Accelerator(cpu=True).device == torch.device("cpu")


# -- gather_for_metrics on a loader from skip_first_batches ---------------------------------------
def gather_after_skipping(samples: int, skip: int, shuffle: bool):
    from torch.utils.data import DataLoader, TensorDataset

    from cadence import Accelerator

    acc = Accelerator(cpu=True)
    loader = acc.prepare(
        DataLoader(TensorDataset(torch.arange(samples)), batch_size=4, shuffle=shuffle)
    )
    whole = [acc.gather_for_metrics(x).tolist() for (x,) in loader]
    skipped = [acc.gather_for_metrics(x).tolist() for (x,) in acc.skip_first_batches(loader, skip)]
    return {"whole": whole, "skipped": skipped}


@pytest.mark.parametrize("samples", [45, 48, 41])
@pytest.mark.parametrize("skip", [0, 1, 5])
@pytest.mark.parametrize("shuffle", [False, True])
def test_gather_for_metrics_counts_each_sample_once_after_skip_first_batches(
    dist_pool, samples, skip, shuffle
):
    # Documented: gather_for_metrics drops the samples repeated to fill the last global batch.
    # Accelerate gathers a skipped loader's last batch whole (docs/differences.md); Cadence drops
    # the repeats there too, so a resumed epoch's metrics count each sample once.
    for result in dist_pool(2).run(gather_after_skipping, samples, skip, shuffle):
        whole, skipped = result["whole"], result["skipped"]
        assert sorted(sum(whole, [])) == list(range(samples))  # each sample once, in all
        # Without shuffling, the skipped loader hands out the same batches as the whole one from
        # batch `skip` on; shuffled, a new epoch's order, but the same count and no repeat.
        if not shuffle:
            assert skipped == whole[skip:]
        flat = sum(skipped, [])
        assert len(flat) == len(set(flat)) == sum(len(b) for b in whole[skip:])


def gather_batch_sampler_drop_last(shuffle: bool):
    from torch.utils.data import (
        BatchSampler,
        DataLoader,
        RandomSampler,
        SequentialSampler,
        TensorDataset,
    )

    from cadence import Accelerator

    acc = Accelerator(cpu=True)
    data = TensorDataset(torch.arange(13))
    sampler = RandomSampler(data) if shuffle else SequentialSampler(data)
    loader = acc.prepare(DataLoader(data, batch_sampler=BatchSampler(sampler, 3, drop_last=True)))
    return [acc.gather_for_metrics(x).tolist() for (x,) in loader]


@pytest.mark.parametrize("shuffle", [False, True])
def test_gather_for_metrics_keeps_every_sample_of_a_batch_sampler_that_drops_the_last(
    dist_pool, shuffle
):
    # 13 samples in batches of 3, the last incomplete one dropped: 4 batches, 2 a process, nothing
    # repeated, so all 12 samples are gathered (Accelerate cuts the last global batch to 13 % 6 = 1).
    for gathered in dist_pool(2).run(gather_batch_sampler_drop_last, shuffle):
        assert [len(batch) for batch in gathered] == [6, 6]
        flat = sum(gathered, [])
        assert len(set(flat)) == 12 and set(flat) <= set(range(13))
