"""Utilities behaving as the reference documents them (found by running the reference's unit tests
under Cadence): environment purging across test-class inheritance, undoing a hand-made fp32 forward
wrapper, `concatenate` of a single batch, nested tensors in `pad_across_processes`, and the logger
name of the environment helpers."""

from __future__ import annotations

import logging
import os
import pickle
import unittest
import warnings

import pytest
import torch

from cadence.utils import purge_accelerate_environment

VARIABLE = "ACCELERATE_PARITY_PURGE_CHECK"


@purge_accelerate_environment
class _PurgingBase(unittest.TestCase):
    def test_base_sets(self):
        os.environ[VARIABLE] = "base"


class _PurgingChild(_PurgingBase):
    def test_child_sets(self):
        os.environ[VARIABLE] = "child"


def test_purge_covers_the_tests_of_subclasses():
    os.environ.pop(VARIABLE, None)
    suite = unittest.TestSuite([_PurgingChild("test_child_sets"), _PurgingChild("test_base_sets")])
    result = unittest.TextTestRunner(stream=open(os.devnull, "w")).run(suite)
    assert result.wasSuccessful()
    assert VARIABLE not in os.environ


def test_purge_restores_a_variable_that_was_there(monkeypatch):
    monkeypatch.setenv(VARIABLE, "before")

    @purge_accelerate_environment
    def change():
        os.environ[VARIABLE] = "changed"
        os.environ[VARIABLE + "_NEW"] = "new"

    change()
    assert os.environ[VARIABLE] == "before"
    assert VARIABLE + "_NEW" not in os.environ


def test_a_hand_wrapped_fp32_forward_is_undone_by_unwrapping():
    from cadence.test_utils import RegressionModel
    from cadence.utils import convert_outputs_to_fp32, extract_model_from_parallel

    model = RegressionModel()
    model._original_forward = model.forward
    model.forward = convert_outputs_to_fp32(model.forward)
    model = extract_model_from_parallel(model, keep_fp32_wrapper=False)
    assert "forward" not in model.__dict__  # the class's own forward again
    assert "_original_forward" not in model.__dict__
    pickle.loads(pickle.dumps(model))  # a wrapped forward (a local function) cannot be pickled


def test_concatenate_of_a_single_batch_returns_it_whatever_it_holds():
    from cadence.utils import concatenate

    assert concatenate(["text"]) == "text"
    assert concatenate([{"ids": "a"}]) == {"ids": "a"}
    joined = concatenate([[torch.ones(2), "label"]])
    assert torch.equal(joined[0], torch.ones(2)) and joined[1] == "label"
    with pytest.raises(TypeError, match="Can only concatenate tensors"):
        concatenate(["a", "b"])


def test_nested_tensors_are_left_unpadded_with_a_warning():
    from cadence import Accelerator
    from cadence.utils import CannotPadNestedTensorWarning, pad_across_processes

    Accelerator(cpu=True)
    nested = torch.nested.nested_tensor([torch.ones(3), torch.ones(1)])
    with pytest.warns(CannotPadNestedTensorWarning, match="Cannot pad nested tensors"):
        assert pad_across_processes(nested) is nested
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        plain = torch.ones(2)
        assert pad_across_processes(plain) is plain


def pad_nested_on_each_rank():
    from cadence import Accelerator
    from cadence.utils import CannotPadNestedTensorWarning, pad_across_processes

    acc = Accelerator(cpu=True)
    nested = torch.nested.nested_tensor([torch.ones(acc.process_index + 1)])
    plain = torch.ones(acc.process_index + 1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = pad_across_processes({"nested": nested, "plain": plain})
    kinds = [w.category for w in caught]
    return out["nested"] is nested, out["plain"].tolist(), kinds.count(CannotPadNestedTensorWarning)


def test_nested_tensors_are_left_unpadded_on_several_processes(dist_pool):
    results = dist_pool(2).run(pad_nested_on_each_rank)
    assert results[0] == (True, [1.0, 0.0], 1)
    assert results[1] == (True, [1.0, 1.0], 1)


def test_environment_helpers_log_under_the_reference_module_path(caplog):
    from cadence.utils import convert_dict_to_env_variables

    with caplog.at_level(logging.WARNING, logger="cadence.utils.environment"):
        lines = convert_dict_to_env_variables({"A": "1", "BAD": "<x", "B": "2"})
    assert lines == ["A=1\n", "B=2\n"]
    assert [r.name for r in caplog.records] == ["cadence.utils.environment"]
    assert "BAD=<x" in caplog.records[0].getMessage()
