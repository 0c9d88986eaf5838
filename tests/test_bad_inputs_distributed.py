"""On several processes a bad input fails on every rank with a message that names the rank.

Two real gloo processes (tests/harness.py). Each case runs on both ranks and returns what it raised,
so the test can check every rank's message.
"""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset


def _run_case(case: str) -> None:
    from cadence import Accelerator
    from cadence.utils import DataLoaderConfiguration

    numbers = TensorDataset(torch.arange(12.0))
    if case == "constructor":
        Accelerator(gradient_accumulation_steps=0)
    elif case == "prepare a dataset":
        Accelerator().prepare(numbers)
    elif case == "split batch not divisible":
        config = DataLoaderConfiguration(split_batches=True)
        Accelerator(dataloader_config=config).prepare(DataLoader(numbers, batch_size=3))
    elif case == "gather text":
        Accelerator().gather({"ids": torch.arange(2), "label": "cat"})
    elif case == "broadcast from a missing rank":
        from cadence.runtime.collectives import broadcast

        Accelerator()
        broadcast(torch.zeros(2), from_process=5)
    else:
        raise AssertionError(f"unknown case {case}")


def outcome(case: str) -> str:
    try:
        _run_case(case)
    except Exception as error:  # noqa: BLE001 - the test inspects every rank's error
        return f"{type(error).__name__}: {error}"
    return "no error"


# case -> (exception type on every rank, or per rank; a phrase every rank's message holds)
CASES = {
    "constructor": ("ValueError", "gradient_accumulation_steps must be a positive integer"),
    "prepare a dataset": ("TypeError", "not datasets"),
    "split batch not divisible": (
        "ValueError",
        "batch size (3) that is a round multiple of the number of processes (2)",
    ),
    "gather text": ("TypeError", "Unsupported types (<class 'str'>)"),
    "broadcast from a missing rank": ("ValueError", "from_process=5 is not a rank"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_every_rank_names_itself_in_the_error(dist_pool, case):
    kinds, phrase = CASES[case]
    kinds = (kinds, kinds) if isinstance(kinds, str) else kinds
    results = dist_pool(2).run(outcome, case, timeout=60)
    for rank, (result, kind) in enumerate(zip(results, kinds)):
        assert result.startswith(f"{kind}: [rank {rank}] "), (rank, result)
        assert phrase in result, (rank, result)
