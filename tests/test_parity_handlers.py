"""`to_kwargs()` of the kwargs handlers as the reference documents it: the fields that differ from the
class defaults, the defaults being those of a handler built with no environment variable set, so a
value that came from the launcher's environment counts as chosen."""

from __future__ import annotations


def test_dynamo_settings_from_the_environment_count_as_chosen(monkeypatch):
    from cadence.utils import TorchDynamoPlugin

    monkeypatch.setenv("ACCELERATE_DYNAMO_BACKEND", "aot_ts_nvfuser")
    monkeypatch.setenv("ACCELERATE_DYNAMO_MODE", "reduce-overhead")
    # the backend as torch.compile names it: lower case
    assert TorchDynamoPlugin().to_kwargs() == {
        "backend": "aot_ts_nvfuser",
        "mode": "reduce-overhead",
    }


def test_dynamo_to_kwargs_leaves_out_regional_compilation():
    from cadence.utils import TorchDynamoPlugin

    plugin = TorchDynamoPlugin(backend="INDUCTOR", use_regional_compilation=True, fullgraph=True)
    assert plugin.to_kwargs() == {"backend": "inductor", "fullgraph": True}
    assert plugin.to_dict()["backend"] == "inductor"
    assert plugin.to_dict()["use_regional_compilation"] is True
    assert TorchDynamoPlugin().to_kwargs() == {}


def test_to_kwargs_leaves_the_environment_as_it_was(monkeypatch):
    import os

    from cadence.utils import DistributedDataParallelKwargs

    monkeypatch.setenv("CADENCE_PARITY_MARKER", "kept")
    before = dict(os.environ)
    assert DistributedDataParallelKwargs(bucket_cap_mb=15).to_kwargs() == {"bucket_cap_mb": 15}
    assert dict(os.environ) == before
