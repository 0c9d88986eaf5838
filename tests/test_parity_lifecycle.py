"""Parity with the reference (issue 12): the Accelerator's life cycle as scripts see it.

Pickling the Accelerator, garbage collection of what it prepared, the `_reset_state()` hint, the
"Item at index" phrase of register_for_checkpointing, the `[RANK n] ` prefix of get_logger, and the
tied-weight notice of save_state at debug level. Multi-process behaviour runs on 2 real gloo
processes (tests/harness.py).
"""

from __future__ import annotations

import gc
import logging
import pickle
import weakref

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset


# -- pickling ------------------------------------------------------------------------------------
def test_the_accelerator_pickles(tmp_path):
    from cadence import Accelerator

    acc = Accelerator(cpu=True, project_dir=str(tmp_path))
    copy = pickle.loads(pickle.dumps(acc))
    assert type(copy) is Accelerator
    assert copy.logging_dir == str(tmp_path)
    assert copy.device == acc.device


@pytest.mark.parametrize("stateful", [False, True])
def test_pickling_inside_the_training_loop(stateful):
    if stateful:
        pytest.importorskip("torchdata.stateful_dataloader")
    from cadence import Accelerator
    from cadence.utils import DataLoaderConfiguration

    config = DataLoaderConfiguration(use_stateful_dataloader=stateful)
    acc = Accelerator(cpu=True, dataloader_config=config)
    loader = acc.prepare(DataLoader(TensorDataset(torch.arange(6.0)), batch_size=2))
    for _ in loader:  # mid-epoch: the loader is registered with GradientState and iterating
        acc_copy = pickle.loads(pickle.dumps(acc))
        loader_copy = pickle.loads(pickle.dumps(loader))
        break
    assert type(acc_copy) is Accelerator
    # A copy starts its own iteration from the start of the epoch, like a new iter() of the original.
    assert [batch[0].tolist() for batch in loader_copy] == [[0.0, 1.0], [2.0, 3.0], [4.0, 5.0]]


# -- garbage collection --------------------------------------------------------------------------
def train_then_drop(stop_after: int | None):
    from cadence import Accelerator

    acc = Accelerator(cpu=True, gradient_accumulation_steps=2)
    model = torch.nn.Linear(1, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = DataLoader(TensorDataset(torch.arange(16.0).unsqueeze(1)), batch_size=2, shuffle=True)
    model, optimizer, loader = acc.prepare(model, optimizer, loader)
    for step, (x,) in enumerate(loader):
        with acc.accumulate(model):
            acc.backward(model(x).sum())
            optimizer.step()
            optimizer.zero_grad()
        if step == stop_after:
            break  # leaves the loader mid-epoch, as an early stop does
    references = [weakref.ref(obj) for obj in (loader, model, optimizer, acc)]
    del loader, model, optimizer, acc, x
    gc.collect()
    return [reference() is None for reference in references]


@pytest.mark.parametrize("stop_after", [None, 1])
def test_prepared_objects_and_the_accelerator_are_freed(dist_pool, stop_after):
    # Nothing global (process state, GradientState's dataloader list...) keeps them alive.
    assert dist_pool(2).run(train_then_drop, stop_after) == [[True, True, True, True]] * 2


# -- the reset hint ------------------------------------------------------------------------------
@pytest.mark.parametrize("count", [0, 1, 2])
def test_free_memory_and_clear_return_a_list_of_nones(count):
    # Accelerate returns a list (release_memory's): `model, opt = ...` works either way, but code
    # that appends to it or compares it with a list does not with a tuple.
    from cadence import Accelerator

    acc = Accelerator(cpu=True)
    objects = [acc.prepare(torch.nn.Linear(2, 2)) for _ in range(count)]
    assert acc.free_memory(*objects) == [None] * count
    assert acc.clear(*objects) == [None] * count
    assert acc._models == []  # and it forgot what it prepared


def test_state_read_after_reset_names_the_reset():
    from cadence import Accelerator
    from cadence.state import AcceleratorState, PartialState

    acc = Accelerator(cpu=True)
    AcceleratorState._reset_state(True)
    with pytest.raises(AttributeError, match=r"`AcceleratorState._reset_state\(\)` was called"):
        acc.distributed_type  # noqa: B018 - the read is the test
    with pytest.raises(AttributeError, match=r"`PartialState._reset_state\(\)` was called"):
        PartialState.__new__(PartialState).device  # noqa: B018
    # hasattr / getattr with a default keep working: the hint is an AttributeError.
    assert getattr(acc.state, "device", None) is None


# -- register_for_checkpointing ------------------------------------------------------------------
def test_register_for_checkpointing_names_each_invalid_item():
    from cadence import Accelerator

    acc = Accelerator(cpu=True)
    with pytest.raises(ValueError) as caught:
        acc.register_for_checkpointing(torch.tensor([1, 2, 3]), {"a": 1}, torch.nn.Linear(1, 1))
    message = str(caught.value)
    assert "Item at index 0, `Tensor`" in message
    assert "Item at index 1, `dict`" in message
    assert "Item at index 2" not in message  # the Linear has state_dict/load_state_dict


# -- get_logger ----------------------------------------------------------------------------------
def test_logger_prefixes_the_rank_on_one_process():
    from cadence import Accelerator
    from cadence.logging import get_logger

    Accelerator(cpu=True)
    records: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record.getMessage())

    logger = get_logger("cadence.test.parity", log_level="INFO")
    handler = Keep()
    logger.logger.addHandler(handler)
    try:
        logger.info("loss %.1f", 0.5)
        logger.debug("hidden")  # below the level: nothing
    finally:
        logger.logger.removeHandler(handler)
    assert records == ["[RANK 0] loss 0.5"]


# -- tied weights in save_state ------------------------------------------------------------------
class TiedLanguageModel(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(5, 3)
        self.head = torch.nn.Linear(3, 5, bias=False)
        self.head.weight = self.embed.weight  # tied, as in every language model


def test_tied_weights_notice_is_debug_level(tmp_path, caplog):
    from cadence import Accelerator

    acc = Accelerator(cpu=True)
    acc.prepare(TiedLanguageModel())
    with caplog.at_level(logging.WARNING):
        acc.save_state(tmp_path / "warn")
    assert not [r for r in caplog.records if "shared tensor" in r.getMessage()]
    caplog.clear()
    with caplog.at_level(logging.DEBUG, logger="cadence"):
        acc.save_state(tmp_path / "debug")
    notices = [r for r in caplog.records if "shared tensor" in r.getMessage()]
    assert notices and all(r.levelno == logging.DEBUG for r in notices)
    assert "head.weight" in notices[0].getMessage()


def test_tied_weights_dropped_by_a_direct_save_are_a_warning(tmp_path, caplog):
    """`cadence.utils.save(..., safe_serialization=True)` called by the script warns once, as the
    reference does (save_state's notice above stays at debug level)."""
    from cadence.utils import save

    with caplog.at_level(logging.WARNING):
        save(TiedLanguageModel().state_dict(), tmp_path / "m.safetensors", safe_serialization=True)
    notices = [r for r in caplog.records if "Removed shared tensor" in r.getMessage()]
    assert len(notices) == 1 and notices[0].levelno == logging.WARNING
    assert "head.weight" in notices[0].getMessage()
