"""Uneven data across processes: `even_batches` (on by default) gives every process the same
batches by repeating samples; off, the last process gets fewer; `join_uneven_inputs` lets a DDP
model train on uneven data and can switch `even_batches` for its block."""

from __future__ import annotations

import warnings

import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset

from cadence import Accelerator
from cadence.runtime.state import AcceleratorState, GradientState
from cadence.test_utils.scripts._checks import check


class DummyDataset(Dataset):
    """`length` samples: the numbers 0..length-1 as float tensors."""

    def __init__(self, length: int) -> None:
        self.length = length

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> torch.Tensor:
        return torch.tensor(float(index))


class DummyIterableDataset(IterableDataset):
    """The items of `data`, as an iterable dataset (no length)."""

    def __init__(self, data: list[float]) -> None:
        self.data = data

    def __iter__(self):  # type: ignore[no-untyped-def]
        yield from (torch.tensor(x) for x in self.data)


def create_accelerator(even_batches: bool = True) -> Accelerator:
    """A fresh Accelerator (process state reset first) with the given `even_batches`."""
    AcceleratorState._reset_state(True)
    GradientState._reset_state()
    from cadence.utils import DataLoaderConfiguration

    return Accelerator(
        cpu=True, dataloader_config=DataLoaderConfiguration(even_batches=even_batches)
    )


def batch_sizes(
    accelerator: Accelerator, length: int, batch_size: int, iterable: bool = False
) -> list[int]:
    """The sizes of the batches this process gets from a prepared loader over `length` samples."""
    dataset = (
        DummyIterableDataset([float(i) for i in range(length)])
        if iterable
        else DummyDataset(length)
    )
    loader = accelerator.prepare(DataLoader(dataset, batch_size=batch_size))
    return [len(batch) for batch in loader]


def test_default_ensures_even_batch_sizes() -> None:
    """Check default ensures even batch sizes (raises AssertionError on failure)."""
    accelerator = create_accelerator()
    n = accelerator.num_processes
    # n*2+1 samples with batch size 1: every process gets 3 batches (samples repeated at the end).
    sizes = batch_sizes(accelerator, 2 * n + 1, 1)
    check(sizes == [1, 1, 1], f"batch size 1: {sizes}")
    # n*2+1 samples with batch size 2: every process gets two full batches.
    sizes = batch_sizes(accelerator, 2 * n + 1, 2)
    check(sizes == [2, 2] if n > 1 else sizes == [2, 1], f"batch size 2: {sizes}")


def test_can_disable_even_batches() -> None:
    """Check can disable even batches (raises AssertionError on failure)."""
    accelerator = create_accelerator(even_batches=False)
    n = accelerator.num_processes
    sizes = batch_sizes(accelerator, 2 * n + 1, 1)
    expected = [1, 1, 1] if accelerator.process_index == 0 else [1, 1]
    check(sizes == expected, f"uneven, batch size 1: {sizes}, expected {expected}")


def test_can_join_uneven_inputs() -> None:
    """Check can join uneven inputs (raises AssertionError on failure)."""
    accelerator = create_accelerator(even_batches=False)
    model = accelerator.prepare(torch.nn.Linear(1, 1))
    loader = accelerator.prepare(
        DataLoader(DummyDataset(2 * accelerator.num_processes + 1), batch_size=1)
    )
    batches = 0
    with accelerator.join_uneven_inputs([model]):
        for batch in loader:
            accelerator.backward(model(batch.reshape(-1, 1)).sum())
            model.zero_grad()
            batches += 1
    expected = 3 if accelerator.process_index == 0 else 2
    check(batches == expected, f"trained on {batches} batches under join, expected {expected}")


def test_join_can_override_even_batches() -> None:
    """Check join can override even batches (raises AssertionError on failure)."""
    accelerator = create_accelerator(even_batches=True)
    model = accelerator.prepare(torch.nn.Linear(1, 1))
    train = accelerator.prepare(DataLoader(DummyDataset(4), batch_size=1))
    valid = accelerator.prepare(DataLoader(DummyDataset(4), batch_size=1))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with accelerator.join_uneven_inputs([model], even_batches=False):
            check(
                not train.batch_sampler.even_batches,
                "join(even_batches=False) switched the train loader",
            )
            check(
                not valid.batch_sampler.even_batches,
                "join(even_batches=False) switched the eval loader",
            )
    check(
        train.batch_sampler.even_batches and valid.batch_sampler.even_batches,
        "even_batches restored after join",
    )


def test_iterable_dataset_even_batches() -> None:
    """Check iterable dataset even batches (raises AssertionError on failure)."""
    accelerator = create_accelerator()
    n = accelerator.num_processes
    sizes = batch_sizes(accelerator, 2 * n + 1, 1, iterable=True)
    check(
        len(sizes) == 3 and all(size == 1 for size in sizes), f"iterable dataset batches: {sizes}"
    )


def main() -> None:
    """Run every check of this script on this process; the first failure raises."""
    for test in (
        test_default_ensures_even_batch_sizes,
        test_can_disable_even_batches,
        test_can_join_uneven_inputs,
        test_join_can_override_even_batches,
        test_iterable_dataset_even_batches,
    ):
        test()
    AcceleratorState._reset_state(True)
    GradientState._reset_state()
    from cadence.runtime.state import PartialState

    if PartialState().is_main_process:
        print("All distributed data loop checks passed.")


def _mp_fn(index: int) -> None:
    """Entry point for spawn-based launchers (one call per process)."""
    main()


if __name__ == "__main__":
    main()
