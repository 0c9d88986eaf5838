"""Execution control and collectives on 1, 2, 3 and 4 real gloo processes, with the spec's examples."""

import os
import time
from collections import namedtuple

import pytest
import torch

from harness import WorkerError

Pair = namedtuple("Pair", ["a", "b"])


# -- functions run on every rank ------------------------------------------------------------------
def state_attributes():
    from cadence import Accelerator, DistributedType, PartialState

    acc = Accelerator()
    state = PartialState()
    assert state is not acc.state.partial_state or True
    return {
        "index": acc.process_index,
        "local": acc.local_process_index,
        "n": acc.num_processes,
        "main": acc.is_main_process,
        "local_main": acc.is_local_main_process,
        "last": acc.is_last_process,
        "distributed": acc.use_distributed,
        "type": acc.distributed_type == (DistributedType.MULTI_CPU if acc.num_processes > 1 else DistributedType.NO),
        "backend": state.backend,
        "device": str(acc.device),
        "shared": PartialState().process_index == state.process_index,
    }  # fmt: skip


def spec_gather_example():
    from cadence import Accelerator

    accelerator = Accelerator()
    process_tensor = torch.tensor([accelerator.process_index], device=accelerator.device)
    return accelerator.gather(process_tensor)


def spec_reduce_example():
    from cadence import Accelerator

    accelerator = Accelerator()
    process_tensor = torch.arange(accelerator.num_processes) + 1 + (2 * accelerator.process_index)
    process_tensor = process_tensor.to(accelerator.device)
    return accelerator.reduce(process_tensor, reduction="sum")


def spec_pad_example():
    from cadence import Accelerator

    accelerator = Accelerator()
    process_tensor = torch.arange(accelerator.process_index + 1).to(accelerator.device)
    padded = accelerator.pad_across_processes(process_tensor)
    padded_first = accelerator.pad_across_processes(process_tensor, pad_index=-1, pad_first=True)
    return padded.shape, padded.tolist(), padded_first.tolist()


def nested_collectives():
    from cadence import Accelerator
    from cadence.utils import broadcast, gather, gather_object, reduce

    acc = Accelerator()
    r = acc.process_index
    data = {"x": torch.tensor([float(r)]), "pair": Pair(torch.tensor([r, r]), [torch.tensor(r)])}
    gathered = gather(data)
    reduced_mean = reduce({"v": torch.tensor([2.0 * r])}, reduction="mean")
    objects = gather_object([f"rank{r}"])
    source = torch.tensor([r * 10 + 1, r * 10 + 2])
    broadcast([source], from_process=acc.num_processes - 1)
    return {
        "x": gathered["x"].tolist(),
        "pair_type": type(gathered["pair"]).__name__,
        "pair_a": gathered["pair"].a.tolist(),
        "pair_b": gathered["pair"].b[0].tolist(),
        "mean": reduced_mean["v"].tolist(),
        "objects": objects,
        "broadcast": source.tolist(),
    }


def broadcast_objects():
    from cadence import PartialState
    from cadence.utils import broadcast_object_list

    state = PartialState()
    items = [{"from": state.process_index}, "x"] if state.is_main_process else [None, None]
    broadcast_object_list(items)
    return items


def decorators():
    from cadence import Accelerator

    acc = Accelerator()
    calls = []

    @acc.on_main_process
    def main_only():
        calls.append("main")

    @acc.on_local_main_process
    def local_main_only():
        calls.append("local_main")

    @acc.on_last_process
    def last_only():
        calls.append("last")

    @acc.on_process(process_index=1)
    def second():
        calls.append("p1")

    @acc.on_local_process(local_process_index=1)
    def second_local():
        calls.append("l1")

    @acc.on_local_process(local_process_idx=0)  # the spelling of the spec's example
    def first_local():
        calls.append("l0")

    @acc.on_main_process()
    def main_with_parentheses():
        calls.append("main()")

    for fn in (main_only, local_main_only, last_only, second, second_local, first_local,
               main_with_parentheses):  # fmt: skip
        fn()
    return calls


def ordering(path, local):
    from cadence import Accelerator

    acc = Accelerator()
    context = acc.local_main_process_first() if local else acc.main_process_first()
    with context:
        with open(path, "a") as f:
            f.write(f"enter {acc.process_index}\n")
        if acc.process_index == 0:
            time.sleep(0.3)
        with open(path, "a") as f:
            f.write(f"exit {acc.process_index}\n")
    acc.wait_for_everyone()
    return open(path).read().split("\n")[:-1]


def triggers():
    from cadence import Accelerator

    acc = Accelerator()
    first = acc.check_trigger()
    if acc.process_index == acc.num_processes - 1:
        acc.set_trigger()
    second = acc.check_trigger()
    third = acc.check_trigger()  # reset after being seen
    return first, second, third


def split(inputs, apply_padding):
    from cadence import Accelerator

    acc = Accelerator()
    original = repr(inputs)
    with acc.split_between_processes(inputs, apply_padding=apply_padding) as part:
        result = part.tolist() if isinstance(part, torch.Tensor) else part
    assert repr(inputs) == original, "split_between_processes modified its argument"
    return result


def print_once(capsys_path):
    import contextlib
    import io

    from cadence import Accelerator

    acc = Accelerator()
    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer):
        acc.print("hello")
    return buffer.getvalue()


def debug_mismatch():
    from cadence import Accelerator
    from cadence.utils import DistributedOperationException

    acc = Accelerator()
    assert acc.state.debug
    tensor = torch.zeros(acc.process_index + 1, 3)
    try:
        acc.gather(tensor)
    except DistributedOperationException as error:
        return str(error)
    return "no error"


def bad_inputs():
    from cadence import Accelerator

    acc = Accelerator()
    errors = {}
    for name, call in {
        "unknown_reduction": lambda: acc.reduce(torch.ones(1), reduction="product"),
        "non_tensor": lambda: acc.gather("text"),
        "non_tensor_nested": lambda: acc.gather({"a": torch.ones(1), "b": 3}),
        "bad_source": lambda: __import__("cadence.utils", fromlist=["x"]).broadcast(
            torch.ones(1), from_process=99
        ),
    }.items():
        try:
            call()
            errors[name] = None
        except (ValueError, TypeError) as error:
            errors[name] = f"{type(error).__name__}: {error}"
    return errors


def logger_output():
    import logging

    from cadence import Accelerator
    from cadence.logging import get_logger

    acc = Accelerator()
    records = []

    class Keep(logging.Handler):
        def emit(self, record):
            records.append(record.getMessage())

    logger = get_logger("cadence.test.logger", log_level="INFO")
    logger.logger.addHandler(Keep())
    logger.info("main only")
    logger.info(f"everyone {acc.process_index}", main_process_only=False)
    logger.info(f"in order {acc.process_index}", in_order=True)
    return records


def seeded_draws():
    import random

    import numpy as np

    from cadence import PartialState
    from cadence.utils import set_seed, synchronize_rng_states

    state = PartialState()
    set_seed(42)
    same = (random.random(), float(np.random.rand()), torch.rand(1).item())
    set_seed(42, device_specific=True)
    specific = torch.rand(1).item()
    torch.manual_seed(state.process_index + 100)
    synchronize_rng_states(["torch"])
    synced = torch.rand(1).item()
    return same, specific, synced


# -- tests ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("n", [1, 2, 3])
def test_state_attributes(dist_pool, n):
    results = dist_pool(n).run(state_attributes)
    for rank, r in enumerate(results):
        assert r["index"] == rank and r["local"] == rank and r["n"] == n
        assert r["main"] == (rank == 0) and r["local_main"] == (rank == 0)
        assert r["last"] == (rank == n - 1)
        assert r["distributed"] == (n > 1) and r["type"] and r["shared"]
        assert r["backend"] == ("gloo" if n > 1 else None)
        assert r["device"] == ("cpu:0" if n > 1 else "cpu")


def test_spec_gather_example_on_four_processes(dist_pool):
    for result in dist_pool(4).run(spec_gather_example):
        assert torch.equal(result, torch.tensor([0, 1, 2, 3]))


def test_spec_reduce_example_on_two_processes(dist_pool):
    for result in dist_pool(2).run(spec_reduce_example):
        assert torch.equal(result, torch.tensor([4, 6]))


def test_spec_pad_example_on_two_processes(dist_pool):
    results = dist_pool(2).run(spec_pad_example)
    assert [r[0] for r in results] == [torch.Size([2])] * 2
    assert results[0][1] == [0, 0] and results[1][1] == [0, 1]
    assert results[0][2] == [-1, 0] and results[1][2] == [0, 1]


@pytest.mark.parametrize("n", [1, 3])
def test_gather_and_reduce_on_other_sizes(dist_pool, n):
    for result in dist_pool(n).run(spec_gather_example):
        assert result.tolist() == list(range(n))
    # rank r holds [1 + 2r, 2 + 2r, ...]: column j sums to n(j+1) + n(n-1)
    expected = [n * (j + 1) + n * (n - 1) for j in range(n)]
    for result in dist_pool(n).run(spec_reduce_example):
        assert result.tolist() == expected


@pytest.mark.parametrize("n", [2, 3])
def test_nested_collectives(dist_pool, n):
    for r in dist_pool(n).run(nested_collectives):
        assert r["x"] == [float(i) for i in range(n)]
        assert r["pair_type"] == "Pair"
        assert r["pair_a"] == [i for i in range(n) for _ in range(2)]
        assert r["pair_b"] == list(range(n))
        assert r["mean"] == [sum(2.0 * i for i in range(n)) / n]
        assert r["objects"] == [f"rank{i}" for i in range(n)]
        assert r["broadcast"] == [(n - 1) * 10 + 1, (n - 1) * 10 + 2]


def test_single_process_collectives_are_identity(dist_pool):
    r = dist_pool(1).run(nested_collectives)[0]
    assert r["x"] == [0.0] and r["objects"] == ["rank0"] and r["broadcast"] == [1, 2]


@pytest.mark.parametrize("n", [1, 2])
def test_broadcast_object_list(dist_pool, n):
    for items in dist_pool(n).run(broadcast_objects):
        assert items == [{"from": 0}, "x"]


@pytest.mark.parametrize("n", [1, 2, 3])
def test_decorators(dist_pool, n):
    results = dist_pool(n).run(decorators)
    if n == 1:  # on a single process every decorated function runs
        assert results[0] == ["main", "local_main", "last", "p1", "l1", "l0", "main()"]
        return
    for rank, calls in enumerate(results):
        expected = []
        if rank == 0:
            expected += ["main", "local_main"]
        if rank == n - 1:
            expected.append("last")
        if rank == 1:
            expected += ["p1", "l1"]
        if rank == 0:
            expected.append("l0")
        if rank == 0:
            expected.append("main()")
        assert calls == expected


@pytest.mark.parametrize("local", [False, True])
def test_main_process_goes_first(dist_pool, tmp_path, local):
    path = str(tmp_path / "order.txt")
    lines = dist_pool(3).run(ordering, path, local)[0]
    assert lines[:2] == ["enter 0", "exit 0"]
    assert sorted(lines[2:]) == ["enter 1", "enter 2", "exit 1", "exit 2"]


@pytest.mark.parametrize("n", [1, 2, 3])
def test_set_and_check_trigger(dist_pool, n):
    for result in dist_pool(n).run(triggers):
        assert result == (False, True, False)


def test_split_between_processes_spec_example(dist_pool):
    assert dist_pool(2).run(split, ["A", "B", "C"], False) == [["A", "B"], ["C"]]
    assert dist_pool(2).run(split, ["A", "B", "C"], True) == [["A", "B"], ["C", "C"]]


def test_split_between_processes_kinds(dist_pool):
    pool = dist_pool(3)
    assert pool.run(split, list(range(7)), False) == [[0, 1, 2], [3, 4], [5, 6]]
    assert pool.run(split, (1, 2), False) == [(1,), (2,), ()]
    assert pool.run(split, (1, 2), True) == [(1,), (2,), (2,)]
    assert pool.run(split, torch.arange(4), True) == [[0, 1], [2, 3], [3, 3]]
    assert pool.run(split, {"a": [1, 2, 3], "b": torch.tensor([4, 5, 6])}, False)[1]["a"] == [2]
    assert pool.run(split, range(5), False) == [range(0, 2), range(2, 4), range(4, 5)]
    assert dist_pool(1).run(split, ["A", "B"], True) == [["A", "B"]]


def test_split_rejects_dict_of_unequal_lengths(dist_pool):
    with pytest.raises(WorkerError, match="same length"):
        dist_pool(2).run(split, {"a": [1, 2], "b": [1]}, False)


def test_print_once_per_machine(dist_pool):
    assert dist_pool(2).run(print_once, None) == ["hello\n", ""]


def test_debug_mode_reports_every_ranks_shapes(dist_pool):
    messages = dist_pool(2).run(debug_mismatch, env={"CADENCE_DEBUG": "1"})
    for rank, message in enumerate(messages):
        assert f"[rank {rank}]" in message
        assert (
            "rank 0: gather float32[1, 3]" in message and "rank 1: gather float32[2, 3]" in message
        )


@pytest.mark.parametrize("n", [1, 2])
def test_bad_inputs_are_clear_errors(dist_pool, n):
    for errors in dist_pool(n).run(bad_inputs):
        assert "Unknown reduction 'product'" in errors["unknown_reduction"]
        assert "Unsupported types (<class 'str'>)" in errors["non_tensor"]
        assert "Unsupported types (<class 'int'>)" in errors["non_tensor_nested"]
        if n > 1:
            assert "from_process=99" in errors["bad_source"]


def test_logger_main_process_only_and_in_order(dist_pool):
    results = dist_pool(2).run(logger_output)
    # Every record starts with "[RANK n] ", as the reference's MultiProcessAdapter.process writes it.
    assert results[0] == ["[RANK 0] main only", "[RANK 0] everyone 0", "[RANK 0] in order 0"]
    assert results[1] == ["[RANK 1] everyone 1", "[RANK 1] in order 1"]


def test_set_seed_and_synchronize(dist_pool):
    results = dist_pool(2).run(seeded_draws)
    assert results[0][0] == results[1][0]
    assert results[0][1] != results[1][1]
    assert results[0][2] == results[1][2]


def test_logger_needs_state():
    from cadence.logging import get_logger
    from cadence.state import reset_state

    reset_state()
    with pytest.raises(RuntimeError, match="PartialState"):
        get_logger("x").info("hi")


def test_reset_state_gives_a_fresh_state():
    from cadence import PartialState
    from cadence.state import reset_state

    reset_state()
    first = PartialState()
    assert first.initialized and first.num_processes == 1
    reset_state()
    assert not PartialState._shared_state
    assert os.environ.get("RANK") is None
