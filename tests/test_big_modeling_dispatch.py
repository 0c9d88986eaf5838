"""dispatch_model, hooks, CPU and disk offload: the outputs are exactly the plain model's."""

import json
import os

import pytest
import torch
from big_model_helpers import RSS_SNIPPET, TinyLM, greedy_generate, run_python, trained_model
from torch import nn

from cadence import cpu_offload, cpu_offload_with_hook, disk_offload, dispatch_model
from cadence.hooks import (
    AlignDevicesHook,
    ModelHook,
    SequentialHook,
    add_hook_to_module,
    remove_hook_from_module,
    remove_hook_from_submodules,
)
from cadence.utils import OffloadedWeightsLoader, find_tied_parameters, offload_state_dict
from cadence.utils.modeling import get_state_dict_offloaded_model

IDS = torch.tensor([[1, 5, 7, 2], [3, 3, 9, 30]])
MIXED_MAP = {"emb": "cpu", "blocks.0": "cpu", "blocks.1": "disk", "blocks.2": "cpu", "blocks.3": "disk", "final": "disk", "head": "cpu"}  # fmt: skip


def copy_of(model: nn.Module) -> TinyLM:
    fresh = TinyLM()
    fresh.load_state_dict(model.state_dict())
    return fresh.eval()


def test_dispatch_over_cpu_and_disk_gives_the_plain_outputs(tmp_path):
    plain = trained_model()
    expected = plain(IDS)
    model = dispatch_model(copy_of(plain), MIXED_MAP, offload_dir=tmp_path)
    assert model.hf_device_map == MIXED_MAP
    assert torch.equal(model(IDS), expected)
    # a second call: the weights went back to disk and come in again
    assert torch.equal(model(IDS), expected)
    # generate-style: the model fed its own output, step after step
    assert torch.equal(greedy_generate(model, IDS, 6), greedy_generate(plain, IDS, 6))


def test_offloaded_weights_live_in_files_not_in_the_model(tmp_path):
    plain = trained_model()
    model = dispatch_model(copy_of(plain), MIXED_MAP, offload_dir=tmp_path)
    index = json.loads((tmp_path / "index.json").read_text())
    disk_tensors = [
        k for k in plain.state_dict() if k.startswith(("blocks.1.", "blocks.3.", "final."))
    ]
    assert sorted(index) == sorted(disk_tensors)
    for name in disk_tensors:
        tensor = plain.state_dict()[name]
        assert index[name] == {"dtype": "float32", "shape": list(tensor.shape)}
        assert os.path.getsize(tmp_path / f"{name}.dat") == tensor.numel() * 4
    # parameters of disk modules are on the meta device (no memory); buffers stay in memory by default
    assert model.blocks[1].up.weight.is_meta and model.final.weight.is_meta
    assert not model.blocks[0].up.weight.is_meta
    assert model.blocks[1].scale.device.type == "cpu"
    # the forward really reads the files: change one on disk and the output follows
    data = torch.from_file(
        str(tmp_path / "blocks.1.up.weight.dat"), size=32 * 16, dtype=torch.float32
    )
    assert torch.equal(data.reshape(32, 16), plain.blocks[1].up.weight)
    with open(tmp_path / "blocks.1.up.weight.dat", "wb") as f:
        f.write(bytes(32 * 16 * 4))
    with torch.no_grad():
        plain.blocks[1].up.weight.zero_()
    assert torch.equal(model(IDS), plain(IDS))


def test_disk_offload_keeps_memory_low(tmp_path):
    # 8 blocks of 2 x 1024x2048 floats: about 134 MB of weights, all sent to disk
    code = (
        RSS_SNIPPET
        + f"""
import torch, sys
sys.path.insert(0, {os.path.dirname(__file__)!r})
from big_model_helpers import TinyLM
from cadence import init_empty_weights, load_checkpoint_and_dispatch
from cadence.checkpointing import save_model
torch.manual_seed(0)
model = TinyLM(d=1024, n_blocks=8, vocab=64)
total = sum(p.numel() * 4 for p in model.parameters())
save_model(model, {str(tmp_path / "ckpt")!r}, max_shard_size="40MB")
ids = torch.tensor([[1, 2, 3]])
expected = model(ids)
del model
import gc; gc.collect()
with init_empty_weights():
    empty = TinyLM(d=1024, n_blocks=8, vocab=64)
before = rss()
device_map = {{"emb": "cpu", "blocks": "disk", "final": "cpu", "head": "cpu"}}
model = load_checkpoint_and_dispatch(empty, {str(tmp_path / "ckpt")!r}, device_map=device_map,
                                     offload_folder={str(tmp_path / "offload")!r})
after_load = rss()
out = model(ids)
print(total, after_load - before, torch.equal(out, expected))
"""
    )
    total, grown, equal = run_python(code).split()
    assert equal == "True"
    # the blocks (97% of the weights) are on disk: memory grew by far less than the model
    assert int(grown) < 0.25 * int(total), (grown, total)


def test_single_device_map_moves_the_model_without_hooks():
    model = dispatch_model(trained_model(), {"": "cpu"})
    assert not hasattr(model, "_hf_hook") and model.hf_device_map == {"": "cpu"}


def test_bad_maps_fail_before_anything_changes(tmp_path):
    model = trained_model()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    offload = tmp_path / "offload"
    cases = [
        ({**MIXED_MAP, "blocks.9": "cpu"}, "does not have: \\['blocks.9'\\]"),
        ({**MIXED_MAP, "head": 7}, "do not exist on this machine .*'head': 7"),
        ({**MIXED_MAP, "head": "cuda:7"}, "do not exist on this machine"),
        (
            {k: v for k, v in MIXED_MAP.items() if k != "final"},
            "does not give any device .*final.weight",
        ),
    ]
    for device_map, message in cases:
        with pytest.raises(ValueError, match=message):
            dispatch_model(model, device_map, offload_dir=offload)
    with pytest.raises(ValueError, match="We need an `offload_dir` to dispatch this model"):
        dispatch_model(model, MIXED_MAP)
    assert not offload.exists() and not hasattr(model, "_hf_hook")
    assert all(not m.__dict__.get("_hf_hook") for m in model.modules())
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_tied_weights_survive_dispatch(tmp_path):
    plain = trained_model()
    # embedding in memory, tied head on disk, and the reverse
    for emb, head in (("cpu", "disk"), ("disk", "cpu")):
        device_map = {"emb": emb, "blocks": "cpu", "final": "cpu", "head": head}
        model = dispatch_model(copy_of(plain), device_map, offload_dir=tmp_path / emb)
        assert find_tied_parameters(model) == [["emb.weight", "head.weight"]]
        assert torch.equal(model(IDS), plain(IDS))


def test_moving_an_offloaded_model_is_refused(tmp_path, caplog):
    model = dispatch_model(trained_model(), MIXED_MAP, offload_dir=tmp_path)
    with pytest.raises(
        RuntimeError, match="You can't move a model that has some modules offloaded"
    ):
        model.to("cpu")
    assert "You shouldn't move a model that is dispatched" in caplog.text


def test_full_state_dict_of_an_offloaded_model(tmp_path):
    plain = trained_model()
    model = dispatch_model(copy_of(plain), MIXED_MAP, offload_dir=tmp_path)
    state = get_state_dict_offloaded_model(model)
    assert list(state) == list(plain.state_dict())
    assert all(torch.equal(state[k], v) for k, v in plain.state_dict().items())
    assert model.blocks[1].up.weight.is_meta  # read back, then offloaded again


def test_cpu_offload_streams_weights_from_a_cpu_state_dict():
    plain = trained_model()
    model = cpu_offload(copy_of(plain), execution_device="cpu")
    assert model.blocks[0].up.weight.is_meta
    assert torch.equal(model(IDS), plain(IDS))
    assert torch.equal(greedy_generate(model, IDS, 4), greedy_generate(plain, IDS, 4))
    remove_hook_from_submodules(model)
    # removing the hooks puts the weights back
    assert not model.blocks[0].up.weight.is_meta and torch.equal(model(IDS), plain(IDS))


def test_disk_offload_writes_every_weight_and_reuses_an_existing_folder(tmp_path):
    plain = trained_model()
    model = disk_offload(copy_of(plain), tmp_path, execution_device="cpu")
    assert (tmp_path / "emb.weight.dat").is_file() and (tmp_path / "index.json").is_file()
    assert torch.equal(model(IDS), plain(IDS))
    stamp = os.path.getmtime(tmp_path / "emb.weight.dat")
    again = disk_offload(copy_of(plain), tmp_path, execution_device="cpu")
    assert os.path.getmtime(tmp_path / "emb.weight.dat") == stamp
    assert torch.equal(again(IDS), plain(IDS))


def test_cpu_offload_with_hook_returns_a_working_handle():
    plain = trained_model()
    first, hook_1 = cpu_offload_with_hook(copy_of(plain), execution_device="cpu")
    second, hook_2 = cpu_offload_with_hook(
        nn.Linear(32, 3), execution_device="cpu", prev_module_hook=hook_1
    )
    out = second(first(IDS))
    assert torch.equal(out, second._old_forward(plain(IDS)))
    hook_2.offload()
    assert next(second.parameters()).device.type == "cpu"
    hook_2.remove()
    assert "forward" not in second.__dict__ and not hasattr(second, "_hf_hook")


class Add(ModelHook):
    def __init__(self, amount: float) -> None:
        self.amount = amount

    def pre_forward(self, module, *args, **kwargs):
        return (args[0] + self.amount,), kwargs

    def post_forward(self, module, output):
        return output * 10


def test_hooks_wrap_and_unwrap_forward():
    layer = nn.Identity()
    add_hook_to_module(layer, Add(1.0))
    assert torch.equal(layer(torch.zeros(2)), torch.full((2,), 10.0))
    # append: both hooks run, in order
    add_hook_to_module(layer, Add(2.0), append=True)
    assert isinstance(layer._hf_hook, SequentialHook)
    assert torch.equal(layer(torch.zeros(2)), torch.full((2,), 300.0))  # (0 + 1 + 2) * 10 * 10
    # replacing keeps the original forward underneath
    add_hook_to_module(layer, Add(5.0))
    assert torch.equal(layer(torch.zeros(2)), torch.full((2,), 50.0))
    remove_hook_from_module(layer)
    assert torch.equal(layer(torch.zeros(2)), torch.zeros(2))
    assert not hasattr(layer, "_hf_hook") and not hasattr(layer, "_old_forward")


def test_no_grad_hooks_and_recursive_removal():
    class NoGrad(ModelHook):
        no_grad = True

    model = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2))
    add_hook_to_module(model[0], NoGrad())
    add_hook_to_module(model[1], ModelHook())
    assert not model[0](torch.ones(2)).requires_grad
    assert model[1](torch.ones(2)).requires_grad
    remove_hook_from_module(model, recurse=True)
    assert not any(hasattr(m, "_hf_hook") for m in model.modules())


def test_align_devices_hook_with_an_offloaded_state(tmp_path):
    plain = trained_model()
    offload_state_dict(tmp_path, plain.blocks[0].state_dict())
    block = copy_of(plain).blocks[0]
    weights = OffloadedWeightsLoader(save_folder=tmp_path)
    assert sorted(weights) == sorted(plain.blocks[0].state_dict())
    hook = AlignDevicesHook(
        execution_device="cpu", offload=True, weights_map=weights, place_submodules=True
    )
    add_hook_to_module(block, hook)
    assert block.up.weight.is_meta
    x = torch.randn(3, 16)
    assert torch.equal(block(x), plain.blocks[0](x))
    assert "offload=True" in repr(hook)
    remove_hook_from_module(block)
    assert torch.equal(block.up.weight, plain.blocks[0].up.weight)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_dispatch_over_gpu_cpu_and_disk(tmp_path):
    plain = trained_model()
    device_map = {"emb": 0, "blocks.0": 0, "blocks.1": "cpu", "blocks.2": "disk", "blocks.3": 0, "final": "cpu", "head": 0}  # fmt: skip
    model = dispatch_model(copy_of(plain), device_map, offload_dir=tmp_path)
    out = model(IDS)
    assert out.device.type == "cpu"  # back on the device of the inputs
    torch.testing.assert_close(out, plain(IDS))
    assert model.blocks[0].up.weight.device == torch.device("cuda", 0)
    assert model.blocks[1].up.weight.is_meta
    cuda_out = model(IDS.cuda())
    assert cuda_out.device == torch.device("cuda", 0)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cpu_offload_with_hook_moves_models_in_turn():
    first, hook_1 = cpu_offload_with_hook(trained_model(), execution_device=0)
    second, hook_2 = cpu_offload_with_hook(
        nn.Linear(32, 3), execution_device=0, prev_module_hook=hook_1
    )
    hidden = first(IDS)
    assert next(first.parameters()).device.type == "cuda"
    second(hidden)
    assert next(first.parameters()).device.type == "cpu"
    assert next(second.parameters()).device.type == "cuda"
    hook_2.offload()
    assert next(second.parameters()).device.type == "cpu"


def test_offloaded_weights_loader_reads_safetensors_entries(tmp_path):
    from safetensors.torch import save_file

    weight = torch.randn(4, 3)
    save_file({"stored.name": weight}, tmp_path / "w.safetensors")
    index = {"layer.weight": {"safetensors_file": str(tmp_path / "w.safetensors"), "weight_name": "stored.name", "dtype": "float16"}}  # fmt: skip
    loader = OffloadedWeightsLoader(state_dict={"layer.bias": torch.ones(3)}, index=index)
    assert list(loader) == ["layer.bias", "layer.weight"] and len(loader) == 2
    assert torch.equal(loader["layer.weight"], weight.half())
    with pytest.raises(ValueError, match="Need either a `state_dict` or a `save_folder`"):
        OffloadedWeightsLoader()
    with pytest.raises(FileNotFoundError, match="holds no index.json"):
        OffloadedWeightsLoader(save_folder=tmp_path)


def test_offload_round_trips_every_dtype(tmp_path):
    from cadence.utils import load_offloaded_weight, offload_weight

    index = {}
    tensors = {
        "bf16": torch.randn(3, 2).bfloat16(),
        "fp8": torch.randn(4).to(torch.float8_e4m3fn),
        "scalar": torch.tensor(2.5),
        "ints": torch.arange(6, dtype=torch.int64).reshape(2, 3),
        "flags": torch.tensor([True, False, True]),
    }
    for name, tensor in tensors.items():
        offload_weight(tensor, name, tmp_path, index=index)
    assert (
        index["bf16"] == {"dtype": "bfloat16", "shape": [3, 2]} and index["scalar"]["shape"] == []
    )
    for name, tensor in tensors.items():
        back = load_offloaded_weight(tmp_path / f"{name}.dat", index[name])
        assert back.dtype == tensor.dtype and back.shape == tensor.shape
        if tensor.ndim:  # compare the bytes: fp8 has no equality kernel on CPU
            assert torch.equal(back.view(torch.uint8), tensor.view(torch.uint8))
        else:
            assert back.item() == tensor.item()


def test_layerwise_casting_stores_low_and_computes_high():
    from cadence.big_modeling import attach_layerwise_casting_hooks

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2))
    expected_weights = [model[0].weight.to(torch.bfloat16).float(), model[2].weight.clone()]
    attach_layerwise_casting_hooks(model, storage_dtype=torch.bfloat16, compute_dtype=torch.float32, skip_modules_pattern=r"^2$")  # fmt: skip
    assert model[0].weight.dtype == torch.bfloat16 and model[2].weight.dtype == torch.float32
    x = torch.randn(3, 4)
    out = model(x)
    assert out.dtype == torch.float32 and model[0].weight.dtype == torch.bfloat16
    reference = (
        torch.relu(x @ expected_weights[0].T + model[0].bias.float()) @ expected_weights[1].T
        + model[2].bias
    )
    torch.testing.assert_close(out, reference)
