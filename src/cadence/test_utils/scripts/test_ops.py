"""Collectives across the launched processes: gather, gather_object, broadcast, padding, reduce
(sum/mean/max), the debug-mode shape check and copying a tensor held by one process to all."""

from __future__ import annotations

import torch

from cadence.runtime.state import PartialState
from cadence.test_utils.scripts._checks import check
from cadence.utils import (
    DistributedOperationException,
    broadcast,
    gather,
    gather_object,
    pad_across_processes,
    reduce,
)
from cadence.utils.operations import copy_tensor_to_devices


def create_tensor(state: PartialState) -> torch.Tensor:
    """[1, 2, 3] on process 0, [4, 5, 6] on process 1, ... on this process's device."""
    start = state.process_index * state.num_processes
    return (torch.arange(state.num_processes, dtype=torch.float32) + start + 1).to(state.device)


def test_gather(state: PartialState) -> None:
    """Check gather (raises AssertionError on failure)."""
    gathered = gather(create_tensor(state))
    expected = list(range(1, state.num_processes**2 + 1))
    check(gathered.tolist() == expected, f"gather gave {gathered.tolist()}, expected {expected}")


def test_gather_object(state: PartialState) -> None:
    """Check gather object (raises AssertionError on failure)."""
    gathered = gather_object([state.process_index])
    check(gathered == list(range(state.num_processes)), f"gather_object gave {gathered}")


def test_gather_non_contiguous(state: PartialState) -> None:
    """Check gather non contiguous (raises AssertionError on failure)."""
    tensor = (
        torch.arange(12, device=state.device).reshape(4, 3).t()
    )  # a transposed, non-contiguous view
    gathered = gather(tensor)
    check(
        gathered.shape == (3 * state.num_processes, 4),
        f"non-contiguous gather shape {tuple(gathered.shape)}",
    )
    check(torch.equal(gathered[:3].cpu(), tensor.cpu()), "non-contiguous gather values")


def test_broadcast(state: PartialState) -> None:
    """Check broadcast (raises AssertionError on failure)."""
    tensor = create_tensor(state)
    received = broadcast(tensor)
    expected = list(range(1, state.num_processes + 1))
    check(received.tolist() == expected, f"broadcast from process 0 gave {received.tolist()}")


def test_pad_across_processes(state: PartialState) -> None:
    """Check pad across processes (raises AssertionError on failure)."""
    tensor = torch.ones(state.process_index + 1, device=state.device)
    padded = pad_across_processes(tensor)
    check(padded.shape[0] == state.num_processes, f"padded length {padded.shape[0]}")
    check(
        padded[: state.process_index + 1].sum().item() == state.process_index + 1,
        "padding kept the values",
    )
    check(padded[state.process_index + 1 :].sum().item() == 0, "padding is zeros")


def test_reduce_sum(state: PartialState) -> None:
    """Check reduce sum (raises AssertionError on failure)."""
    total = reduce(create_tensor(state), reduction="sum")
    n = state.num_processes
    expected = [float(sum(r * n + i + 1 for r in range(n))) for i in range(n)]
    check(total.tolist() == expected, f"reduce(sum) gave {total.tolist()}, expected {expected}")


def test_reduce_mean(state: PartialState) -> None:
    """Check reduce mean (raises AssertionError on failure)."""
    mean = reduce(create_tensor(state), reduction="mean")
    n = state.num_processes
    expected = [sum(r * n + i + 1 for r in range(n)) / n for i in range(n)]
    check(torch.allclose(mean.cpu(), torch.tensor(expected)), f"reduce(mean) gave {mean.tolist()}")


def test_reduce_max(state: PartialState) -> None:
    """Check reduce max (raises AssertionError on failure)."""
    largest = reduce(create_tensor(state), reduction="max")
    n = state.num_processes
    expected = [float((n - 1) * n + i + 1) for i in range(n)]
    check(largest.tolist() == expected, f"reduce(max) gave {largest.tolist()}")


def test_op_checker(state: PartialState) -> None:
    """In debug mode, a gather of different shapes raises DistributedOperationException everywhere."""
    if not state.debug or state.num_processes < 2:
        return
    tensor = torch.ones(state.process_index + 1, device=state.device)
    try:
        gather(tensor)
    except DistributedOperationException:
        return
    check(False, "debug mode let a gather of mismatched shapes through")


def test_copy_tensor_to_devices(state: PartialState) -> None:
    """Check copy tensor to devices (raises AssertionError on failure)."""
    source = torch.tensor([1.0, 2.0, 3.0]) if state.is_main_process else None
    copied = copy_tensor_to_devices(source)
    check(copied.tolist() == [1.0, 2.0, 3.0], f"copy_tensor_to_devices gave {copied.tolist()}")


def main() -> None:
    """Run every check of this script on this process; the first failure raises."""
    state = PartialState()
    state.print(f"State: {state}")
    for test in (
        test_gather,
        test_gather_object,
        test_gather_non_contiguous,
        test_broadcast,
        test_pad_across_processes,
        test_reduce_sum,
        test_reduce_mean,
        test_reduce_max,
        test_op_checker,
        test_copy_tensor_to_devices,
    ):
        state.print(f"testing {test.__name__}")
        test(state)
    state.wait_for_everyone()
    state.print("All collective operations passed.")


def _mp_fn(index: int) -> None:
    """Entry point for spawn-based launchers (one call per process)."""
    main()


if __name__ == "__main__":
    main()
