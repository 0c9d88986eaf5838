"""What the reference's callers rely on beyond its signatures (issue 23): an explicit dynamo backend
"no" compiles nothing; `get_max_memory` converts the caller's dict in place (transformers compares its
own dict with the result afterwards)."""

from __future__ import annotations

import pytest
import torch

from cadence import Accelerator
from cadence.utils import DynamoBackend, TorchDynamoPlugin, get_max_memory


@pytest.mark.parametrize("backend", [DynamoBackend.NO, "no", "NO"])
def test_explicit_backend_no_compiles_nothing_whatever_the_other_fields(backend):
    plugin = TorchDynamoPlugin(backend=backend, mode="max-autotune", fullgraph=True, dynamic=True)
    accelerator = Accelerator(cpu=True, dynamo_plugin=plugin)
    model = accelerator.prepare(torch.nn.Linear(3, 2))
    assert not hasattr(model, "_orig_mod")  # what torch.compile's wrapper holds
    assert accelerator.state.dynamo_plugin.backend == DynamoBackend.NO
    assert model(torch.ones(1, 3)).shape == (1, 2)


def test_get_max_memory_converts_the_given_dict_in_place():
    given = {"disk": "2GB", "cpu": "1KiB"}
    result = get_max_memory(given)
    assert given == {"disk": 2 * 10**9, "cpu": 1024}
    assert result == {"cpu": 1024, "disk": 2 * 10**9} and list(result) == ["cpu", "disk"]
    assert result is not given


def test_get_max_memory_refuses_an_unknown_device_before_converting():
    given = {"cpu": "1GB", "tpu9": "1GB"}
    with pytest.raises(ValueError, match="tpu9"):
        get_max_memory(given)
    assert given == {"cpu": "1GB", "tpu9": "1GB"}
