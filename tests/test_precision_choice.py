"""The requested mixed precision is parsed and checked once, in the Accelerator's settings, into a
frozen `PrecisionChoice` that the process state stores and the strategy turns into its `Precision`;
bad input fails there, before the process state exists."""

from __future__ import annotations

import dataclasses
import importlib.util

import pytest
import torch.distributed as dist

from cadence import Accelerator
from cadence.precision import choice as choice_module
from cadence.precision.choice import PrecisionChoice, choose_precision
from cadence.precision.policy import AutocastPrecision, Precision
from cadence.state import AcceleratorState, PartialState

HAS_DEEPSPEED = importlib.util.find_spec("deepspeed") is not None


def _untouched() -> bool:
    return PartialState._shared_state == {} and not (dist.is_available() and dist.is_initialized())


def test_the_choice_records_the_name_and_where_it_came_from(monkeypatch):
    for name in ("CADENCE_MIXED_PRECISION", "ACCELERATE_MIXED_PRECISION"):
        monkeypatch.delenv(name, raising=False)
    assert choose_precision().mixed_precision == "no"
    assert choose_precision().source == "default"
    explicit = choose_precision("BF16", {})
    assert (explicit.mixed_precision, explicit.source, explicit.explicit) == (
        "bf16",
        "argument",
        True,
    )
    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", "fp16")
    from_env = choose_precision(None, {})
    assert (
        from_env.mixed_precision == "fp16" and from_env.source == "env:ACCELERATE_MIXED_PRECISION"
    )
    assert not from_env.explicit
    assert choose_precision(None, {"mixed_precision": "bf16"}).mixed_precision == "bf16"
    with pytest.raises(dataclasses.FrozenInstanceError):
        explicit.mixed_precision = "fp16"  # type: ignore[misc]
    with pytest.raises(ValueError, match="choose one of no, fp8, fp16, bf16"):
        choose_precision("fp64", {})


def test_the_accelerator_parses_and_checks_the_precision_once(monkeypatch):
    calls = {"parse": 0, "check": 0}
    parse, check = choice_module.parse_mixed_precision, choice_module.check_precision_supported

    def counted_parse(*args, **kwargs):
        calls["parse"] += 1
        return parse(*args, **kwargs)

    def counted_check(*args, **kwargs):
        calls["check"] += 1
        return check(*args, **kwargs)

    monkeypatch.setattr(choice_module, "parse_mixed_precision", counted_parse)
    monkeypatch.setattr(choice_module, "check_precision_supported", counted_check)
    accelerator = Accelerator(cpu=True, mixed_precision="bf16")
    assert calls == {"parse": 1, "check": 1}
    assert accelerator.mixed_precision == "bf16" and accelerator.state.mixed_precision == "bf16"
    chosen = accelerator.state.precision_choice
    assert isinstance(chosen, PrecisionChoice) and chosen.mixed_precision == "bf16"
    policy = accelerator._strategy.precision
    assert isinstance(policy, AutocastPrecision) and policy.mixed_precision == "bf16"


def test_a_second_accelerator_keeps_the_first_precision_unless_it_asks_for_another():
    Accelerator(cpu=True, mixed_precision="bf16")
    second = Accelerator(cpu=True)  # no precision asked: the process state's
    assert second.mixed_precision == "bf16"
    assert isinstance(second._strategy.precision, AutocastPrecision)
    with pytest.raises(ValueError, match="already created with mixed_precision='bf16'"):
        Accelerator(cpu=True, mixed_precision="no")


def test_accelerator_state_created_directly_checks_the_same_way():
    with pytest.raises(ValueError, match="choose one of"):
        AcceleratorState(mixed_precision="fp64", cpu=True)
    assert _untouched()
    state = AcceleratorState(mixed_precision="no", cpu=True)
    assert state.mixed_precision == "no" and state.precision_choice.source == "argument"
    assert isinstance(Accelerator(cpu=True)._strategy.precision, Precision)


@pytest.mark.skipif(not HAS_DEEPSPEED, reason="needs deepspeed")
def test_a_deepspeed_config_enabling_the_other_precision_fails_before_the_process_state():
    from cadence.utils import DeepSpeedPlugin

    plugin = DeepSpeedPlugin(hf_ds_config={"zero_optimization": {}, "bf16": {"enabled": True}})
    with pytest.raises(ValueError, match="conflicts with `bf16` enabled in the DeepSpeed config"):
        Accelerator(cpu=True, mixed_precision="fp16", deepspeed_plugin=plugin)
    assert _untouched()
