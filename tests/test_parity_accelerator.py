"""Accelerator details the reference's own tests check: prepared objects carry the reference's
`_is_accelerate_prepared` flag, and an unknown attribute of `accelerator.state` is reported as the
`AcceleratorState`'s."""

from __future__ import annotations

import pytest
import torch


def test_prepared_objects_carry_the_reference_flag():
    from cadence import Accelerator

    acc = Accelerator(cpu=True)
    model = torch.nn.Linear(2, 4)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1)
    loader = torch.utils.data.DataLoader(list(range(8)), batch_size=2)
    other = object.__new__(type("Plain", (), {}))
    prepared = acc.prepare(model, optimizer, scheduler, loader, other)
    for obj in prepared[:4]:
        assert getattr(obj, "_is_accelerate_prepared", False) is True, type(obj).__name__
    assert prepared[4] is other and not hasattr(other, "_is_accelerate_prepared")
    assert getattr(optimizer, "_is_accelerate_prepared", False) is False  # the user's own object


def test_unknown_state_attribute_names_accelerator_state():
    from cadence import Accelerator

    acc = Accelerator(cpu=True)
    with pytest.raises(
        AttributeError, match="'AcceleratorState' object has no attribute 'nothing'"
    ):
        _ = acc.state.nothing
    acc.state.something = "value"  # setting a new attribute still works
    assert acc.state.something == "value"
    with pytest.raises(AttributeError, match=r"AcceleratorState\._reset_state\(\)"):
        acc.state._reset_state()
        _ = acc.num_processes
