"""CUDA-only behaviour: an NCCL group of one, autocast and GradScaler on the GPU, pinned memory and the
side-stream prefetch of the prepared loader, CUDA RNG in checkpoints, CUDA memory release.

Every test here needs an NVIDIA GPU and is skipped cleanly without one (CI has none). They run in the
test process (which has no process group, so `Accelerator()` picks cuda:0) or, for NCCL, under a real
`torch.distributed.run` of one process.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import torch

from harness import free_port

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU")


def _tiny_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))


NCCL_SCRIPT = textwrap.dedent(
    """
    import sys
    import torch
    import torch.distributed as dist
    from cadence import Accelerator

    mode = sys.argv[1]
    if mode == "adopt":
        dist.init_process_group("nccl")  # the user's own group of one, which Cadence adopts
        acc = Accelerator()
        value = acc.gather(torch.tensor([7.0], device=acc.device)).tolist()
    else:
        from torch.distributed.tensor import DTensor
        from cadence.plugins import FullyShardedDataParallelPlugin

        acc = Accelerator(fsdp_plugin=FullyShardedDataParallelPlugin(fsdp_version=2))
        model = torch.nn.Linear(4, 4)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        model, optimizer = acc.prepare(model, optimizer)
        loss = model(torch.ones(2, 4, device=acc.device)).sum()
        acc.backward(loss)
        optimizer.step()
        value = all(isinstance(p, DTensor) for p in model.parameters())
    print("RESULT", dist.get_backend(), dist.get_world_size(), acc.device, acc.distributed_type, value)
    """
)


@pytest.mark.parametrize(
    "mode, expected",
    [
        ("adopt", "RESULT nccl 1 cuda:0 DistributedType.NO [7.0]"),
        ("fsdp", "RESULT nccl 1 cuda:0 DistributedType.FSDP True"),
    ],
)
def test_an_nccl_group_of_one_under_torchrun(tmp_path, mode, expected):
    script = tmp_path / "nccl.py"
    script.write_text(NCCL_SCRIPT)
    done = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=1",
         f"--master_port={free_port()}", str(script), mode],
        capture_output=True, text=True, timeout=300, env=dict(os.environ, OMP_NUM_THREADS="1"),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert expected in done.stdout


def test_bf16_autocast_runs_the_layers_in_bf16_and_returns_fp32():
    from cadence import Accelerator

    acc = Accelerator(mixed_precision="bf16")
    assert acc.device.type == "cuda"
    model = acc.prepare(_tiny_model())
    seen = []
    model[0].register_forward_hook(lambda module, args, output: seen.append(output.dtype))
    output = model(torch.randn(4, 8, device=acc.device))
    assert seen == [torch.bfloat16] and output.dtype == torch.float32 and output.is_cuda


def test_fp16_grad_scaler_on_cuda_skips_an_overflowing_step():
    from cadence import Accelerator, GradScalerKwargs

    acc = Accelerator(mixed_precision="fp16", kwargs_handlers=[GradScalerKwargs(init_scale=1024.0)])
    model = _tiny_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer = acc.prepare(model, optimizer)
    assert isinstance(acc.scaler, torch.amp.GradScaler) and acc.scaler._device == "cuda"
    before = [p.detach().clone() for p in model.parameters()]
    loss = model(torch.full((2, 8), float("inf"), device=acc.device)).sum()
    acc.backward(loss)
    optimizer.step()
    optimizer.zero_grad()
    # An inf gradient: the step is skipped, the scale halves (backoff_factor 0.5).
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    assert acc.scaler.get_scale() == 512.0 and optimizer.step_was_skipped
    loss = model(torch.randn(2, 8, device=acc.device)).sum()
    acc.backward(loss)
    optimizer.step()
    assert not optimizer.step_was_skipped
    assert not all(torch.equal(a, b) for a, b in zip(before, model.parameters()))


def test_prepared_loader_pins_host_memory_and_delivers_on_the_gpu():
    from torch.utils.data import DataLoader, TensorDataset

    from cadence import Accelerator

    acc = Accelerator()
    data = TensorDataset(torch.arange(64, dtype=torch.float32).reshape(32, 2), torch.arange(32))
    loader = acc.prepare(DataLoader(data, batch_size=4))
    assert loader.pin_memory  # pinned because the batches go to a CUDA device
    batches = []
    for x, y in loader:
        assert x.is_cuda and y.is_cuda
        # Work on the training stream while the next batch is copied on the side stream.
        batches.append((x @ torch.ones(2, 2, device=x.device) / 2, y.clone()))
    assert torch.equal(torch.cat([x for x, _ in batches]).cpu().sum(1), data.tensors[0].sum(1))
    assert torch.equal(torch.cat([y for _, y in batches]).cpu(), data.tensors[1])


def test_prefetched_batches_are_complete_under_a_busy_training_stream():
    """Large batches, and a long kernel queued on the training stream each step: a batch read before its
    side-stream copy finished would show zeros or stale values."""
    from torch.utils.data import DataLoader, TensorDataset

    from cadence import Accelerator

    acc = Accelerator()
    rows = torch.arange(16, dtype=torch.float32).repeat_interleave(2**16).reshape(16, 2**16)
    loader = acc.prepare(DataLoader(TensorDataset(rows), batch_size=1))
    busy = torch.randn(2048, 2048, device=acc.device)
    for index, (row,) in enumerate(loader):
        for _ in range(5):
            busy = torch.tanh(busy @ busy)  # keeps the training stream busy
        assert torch.all(row == index).item()


def test_cuda_rng_state_round_trips_through_a_checkpoint(tmp_path):
    from cadence import Accelerator

    acc = Accelerator()
    acc.prepare(_tiny_model())
    torch.cuda.manual_seed_all(123)
    acc.save_state(str(tmp_path / "checkpoint"))
    expected = torch.rand(5, device="cuda")
    torch.cuda.manual_seed_all(999)  # disturb
    acc.load_state(str(tmp_path / "checkpoint"))
    assert torch.equal(torch.rand(5, device="cuda"), expected)


def test_free_memory_gives_the_cuda_memory_back():
    from cadence import Accelerator

    acc = Accelerator()
    # The first matmul and backward allocate cuBLAS workspaces through the caching allocator and keep
    # them: done once before the baseline, so that only the model's own tensors are measured.
    warm = torch.nn.Linear(2048, 2048, device=acc.device)
    warm(torch.randn(4, 2048, device=acc.device)).sum().backward()
    del warm
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    baseline = torch.cuda.memory_allocated()
    model = torch.nn.Linear(2048, 2048)  # 16 MiB of fp32 weights
    optimizer = torch.optim.Adam(model.parameters())
    model, optimizer = acc.prepare(model, optimizer)
    acc.backward(model(torch.randn(4, 2048, device=acc.device)).sum())
    optimizer.step()
    weights_and_adam = 3 * 2048 * 2048 * 4  # weights, exp_avg, exp_avg_sq (and as much in grads)
    assert torch.cuda.memory_allocated() > baseline + weights_and_adam
    reserved = torch.cuda.memory_reserved()
    model, optimizer = acc.free_memory(model, optimizer)
    assert model is None and optimizer is None
    assert torch.cuda.memory_allocated() <= baseline + 2**20  # the tensors are gone...
    # ...so the cache can be given back. free_memory empties it while the caller's own names still
    # hold the objects (as the reference's does): the caller's next empty_cache finds them free.
    torch.cuda.empty_cache()
    assert torch.cuda.memory_reserved() <= reserved - weights_and_adam


def test_find_executable_batch_size_shrinks_on_a_real_cuda_out_of_memory():
    from cadence.utils import find_executable_batch_size

    torch.cuda.synchronize()
    baseline = torch.cuda.memory_allocated()
    free, _ = torch.cuda.mem_get_info()
    # A starting batch whose float32 tensor of [batch, 2**20] is twice the free memory.
    start = int(2 * free // (4 * 2**20)) + 1
    tried = []

    @find_executable_batch_size(starting_batch_size=start)
    def allocate(batch_size):
        tried.append(batch_size)
        batch = torch.ones(batch_size, 2**20, device="cuda")
        return batch_size, batch.sum().item() == batch_size * 2**20

    batch_size, ok = allocate()
    assert ok and batch_size < start and tried[0] == start and tried[-1] == batch_size
    torch.cuda.synchronize()
    assert torch.cuda.memory_allocated() <= baseline  # every attempt's memory was given back
