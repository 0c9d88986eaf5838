"""find_executable_batch_size against real out-of-memory errors, release_memory, clear_device_cache."""

from __future__ import annotations

import gc
import json
import subprocess
import sys
import textwrap
import weakref

import pytest
import torch

from cadence.utils.memory import (
    clear_device_cache,
    find_executable_batch_size,
    release_memory,
    should_reduce_batch_size,
)

SAMPLE_BYTES = 2**20  # one sample of the job below: 2**18 float32 values
HEADROOM = 64 * 2**20  # address space left to the job after its imports

CPU_OUT_OF_MEMORY_JOB = textwrap.dedent(
    """
    import json, resource, sys

    import torch

    torch.set_num_threads(1)
    from cadence.utils.memory import find_executable_batch_size

    sample_bytes, headroom = int(sys.argv[1]), int(sys.argv[2])
    with open("/proc/self/status") as status:
        used = next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmSize"))
    # Cap the address space so that big batches really fail to allocate, as on a full machine.
    resource.setrlimit(resource.RLIMIT_AS, (used + headroom, used + headroom))
    tried, errors = [], []


    @find_executable_batch_size(starting_batch_size=128)
    def train(batch_size, scale):
        tried.append(batch_size)
        try:
            batch = torch.ones(batch_size, sample_bytes // 4)
        except RuntimeError as error:
            errors.append(str(error))
            raise
        return int(batch.sum().item()) * scale


    result = train(2)
    print(json.dumps({"tried": tried, "errors": errors, "result": result}))
    """
)


def _reduced_by_a_tenth(sizes: list[int]) -> bool:
    return all(later == int(earlier * 0.9) for earlier, later in zip(sizes, sizes[1:]))


def test_a_real_cpu_out_of_memory_shrinks_the_batch_until_it_fits(tmp_path):
    script = tmp_path / "job.py"
    script.write_text(CPU_OUT_OF_MEMORY_JOB)
    completed = subprocess.run(
        [sys.executable, str(script), str(SAMPLE_BYTES), str(HEADROOM)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert completed.returncode == 0, completed.stderr[-4000:]
    report = json.loads(completed.stdout.strip().splitlines()[-1])
    tried, errors = report["tried"], report["errors"]
    assert tried[0] == 128 and len(tried) > 1
    assert _reduced_by_a_tenth(tried)
    # Every try but the last failed with the CPU allocator's own out-of-memory error.
    assert len(errors) == len(tried) - 1
    assert all("DefaultCPUAllocator: can't allocate memory" in error for error in errors)
    assert tried[-1] * SAMPLE_BYTES <= HEADROOM < tried[0] * SAMPLE_BYTES
    assert report["result"] == tried[-1] * (SAMPLE_BYTES // 4) * 2


def _cuda_out_of_memory(size: int) -> torch.cuda.OutOfMemoryError:
    return torch.cuda.OutOfMemoryError(
        f"CUDA out of memory. Tried to allocate {size} MiB (GPU 0; 7.79 GiB total capacity)"
    )


def test_cuda_out_of_memory_errors_shrink_the_batch():
    tried = []

    @find_executable_batch_size(starting_batch_size=32)
    def step(batch_size):
        tried.append(batch_size)
        if batch_size > 20:
            raise _cuda_out_of_memory(batch_size)
        return batch_size

    assert step() == 19
    assert tried == [32, 28, 25, 22, 19]
    assert _reduced_by_a_tenth(tried)


def test_a_custom_reduction_and_the_bare_decorator_form():
    tried = []

    def halve():
        return tried[-1] // 2

    @find_executable_batch_size(starting_batch_size=100, reduce_batch_size_fn=halve)
    def step(batch_size, offset, *, scale=1):
        tried.append(batch_size)
        if batch_size > 30:
            raise RuntimeError("XPU out of memory. Tried to allocate 2.00 GiB")
        return (batch_size + offset) * scale

    assert step(1, scale=10) == 260
    assert tried == [100, 50, 25]

    @find_executable_batch_size
    def default_start(batch_size):
        return batch_size

    assert default_start() == 128


def test_other_errors_propagate_at_once():
    tried = []

    @find_executable_batch_size(starting_batch_size=16)
    def step(batch_size):
        tried.append(batch_size)
        raise ValueError("bad labels")

    with pytest.raises(ValueError, match="bad labels"):
        step()
    assert tried == [16]


def test_running_out_at_every_size_stops_at_zero_with_a_clear_error():
    tried = []

    @find_executable_batch_size(starting_batch_size=4)
    def step(batch_size):
        tried.append(batch_size)
        raise _cuda_out_of_memory(batch_size)

    with pytest.raises(RuntimeError, match="No executable batch size found, reached zero"):
        step()
    assert tried == [4, 3, 2, 1]


def test_passing_the_batch_size_yourself_is_a_clear_error():
    @find_executable_batch_size(starting_batch_size=8)
    def step(batch_size, model):
        return batch_size

    with pytest.raises(TypeError, match=r"Remove it.*step\(model='m'\)"):
        step(32, "m")


@pytest.mark.parametrize(
    "error, expected",
    [
        (_cuda_out_of_memory(10), True),
        (RuntimeError("CUDA out of memory. Tried to allocate 20.00 MiB"), True),
        (RuntimeError("MPS backend out of memory (MPS allocated: 1 GB)"), True),
        (RuntimeError("NPU out of memory. Tried to allocate 2.00 GiB"), True),
        (RuntimeError("cuDNN error: CUDNN_STATUS_NOT_SUPPORTED. This error may appear"), True),
        (
            RuntimeError(
                "DefaultCPUAllocator: can't allocate memory: you tried to allocate 8 bytes"
            ),
            True,
        ),
        (RuntimeError("shape mismatch"), False),
        (RuntimeError("out of memory.", "second arg"), False),
        (ValueError("CUDA out of memory."), False),
    ],
)
def test_which_errors_count_as_out_of_memory(error, expected):
    assert should_reduce_batch_size(error) is expected


def test_release_memory_drops_the_references_it_was_given():
    class Holder:
        def __init__(self):
            self.tensor = torch.ones(1000)

    first, second = Holder(), Holder()
    watchers = [weakref.ref(first), weakref.ref(second)]
    first, second = release_memory(first, second)
    assert (first, second) == (None, None)
    gc.collect()
    assert [watcher() for watcher in watchers] == [None, None]
    assert release_memory() == []


def test_clear_device_cache_with_garbage_collection_frees_reference_cycles():
    class Node:
        def __init__(self):
            self.tensor = torch.ones(10)
            self.me = self  # a reference cycle: only the garbage collector frees it

    node = Node()
    watcher = weakref.ref(node)
    del node
    clear_device_cache(garbage_collection=True)
    assert watcher() is None
