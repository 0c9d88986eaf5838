"""`estimate-memory` as the reference documents it. The Hub cannot be reached from the test machines,
so its answer (`verify_on_hub`: model info, "gated" or "repo") is supplied by the test; the sizes are
measured on a real model built with empty weights and checked against first principles."""

from __future__ import annotations

import argparse
import types

import pytest
import torch

from cadence.commands import estimate


@pytest.mark.parametrize(
    "answer, phrase", [("gated", "is gated"), ("repo", "does not exist on the Hub")]
)
def test_gated_or_missing_repos_are_os_errors(monkeypatch, answer, phrase):
    monkeypatch.setattr(estimate, "verify_on_hub", lambda repo, token=None: answer)
    args = estimate.estimate_command_parser().parse_args(["someone/some-model"])
    with pytest.raises(OSError, match=phrase):
        estimate.estimate_command(args)


def test_a_repo_without_library_metadata_asks_for_library_name(monkeypatch):
    info = types.SimpleNamespace(library_name=None, config=None)
    monkeypatch.setattr(estimate, "verify_on_hub", lambda repo, token=None: info)
    with pytest.raises(ValueError, match="does not have any library metadata"):
        estimate.create_empty_model("someone/some-model", library_name=None)
    with pytest.raises(ValueError, match="is not supported yet"):
        estimate.create_empty_model("someone/some-model", library_name="sklearn")


def empty_linear_model(*args, **kwargs):
    from cadence import init_empty_weights

    with init_empty_weights():
        return torch.nn.Sequential(torch.nn.Linear(1000, 1000), torch.nn.Linear(1000, 10))


def test_sizes_per_dtype_and_the_printed_table(monkeypatch, capsys):
    monkeypatch.setattr(estimate, "create_empty_model", empty_linear_model)
    args = argparse.Namespace(
        model_name="someone/some-model",
        library_name=None,
        trust_remote_code=False,
        dtypes=["float32", "float16", "int8", "int4"],
    )
    rows = estimate.gather_data(args)
    total = (1000 * 1000 + 1000 + 1000 * 10 + 10) * 4  # fp32 bytes of every parameter
    largest = (1000 * 1000 + 1000) * 4  # the first Linear
    assert [row[0] for row in rows] == args.dtypes
    for row, shrink in zip(rows, (1, 2, 4, 8)):
        assert row[1] == largest / shrink and row[2] == total / shrink
    assert rows[0][3]["step"] == 4 * total  # fp32 Adam: model + grads + 2 states
    assert max(rows[2][3].values()) == -1  # no training estimate for int8
    estimate.estimate_command(args)
    table = capsys.readouterr().out
    assert "Memory Usage for loading `someone/some-model`" in table
    assert "Training using Adam" in table and "N/A" in table
