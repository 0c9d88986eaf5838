"""init_empty_weights, load_checkpoint_in_model and load_checkpoint_and_dispatch on CPU and disk."""

import json
import os

import pytest
import torch
from big_model_helpers import RSS_SNIPPET, TinyLM, greedy_generate, run_python, trained_model
from safetensors.torch import save_file
from torch import nn

from cadence import init_empty_weights, init_on_device, load_checkpoint_and_dispatch
from cadence.checkpointing import save_model
from cadence.utils import find_tied_parameters, load_checkpoint_in_model

IDS = torch.tensor([[1, 5, 7, 2], [3, 3, 9, 30]])


def empty_model(**kwargs) -> TinyLM:
    with init_empty_weights():
        return TinyLM(**kwargs)


@pytest.fixture
def sharded(tmp_path):
    """A trained model saved as 3+ safetensors shards with an index."""
    model = trained_model()
    save_model(model, tmp_path / "ckpt", max_shard_size="3KB")
    assert (tmp_path / "ckpt" / "model.safetensors.index.json").is_file()
    return model, tmp_path / "ckpt"


# ---------------------------------------------------------------------------- empty init
def test_empty_init_puts_parameters_on_meta_and_keeps_ties():
    model = empty_model()
    assert all(p.is_meta for p in model.parameters())
    assert model.blocks[0].scale.device.type == "cpu"  # buffers stay real by default
    assert model.head.weight is model.emb.weight
    assert find_tied_parameters(model) == [["emb.weight", "head.weight"]]
    with init_empty_weights(include_buffers=True):
        full = TinyLM()
    assert full.blocks[0].scale.is_meta
    assert torch.ones(2).device.type == "cpu"  # the patch ends with the block


def test_init_on_device_and_requires_grad():
    with init_on_device("meta"):
        layer = nn.Linear(3, 3)
        layer.bias.requires_grad_(False)
    assert layer.weight.is_meta and isinstance(layer.weight, nn.Parameter)
    assert layer.weight.requires_grad and not layer.bias.requires_grad


def test_empty_init_of_a_10b_parameter_model_allocates_nothing():
    code = (
        RSS_SNIPPET
        + """
import torch
from torch import nn
from cadence import init_empty_weights
before = rss()
reset_peak()
with init_empty_weights():
    # 40 layers of a 4096-wide MLP block (about 10.1e9 parameters, 40 GB in float32)
    model = nn.ModuleList(
        nn.Sequential(nn.Linear(4096, 4 * 4096 * 4), nn.Linear(4 * 4096 * 4, 4096)) for _ in range(40)
    )
print(sum(p.numel() for p in model.parameters()), peak() - before)
"""
    )
    count, grown = map(int, run_python(code).split())
    assert count > 10e9
    assert grown < 50 * 2**20  # under 50 MB for 40 GB of parameters


# ---------------------------------------------------------------------------- loading
def test_sharded_safetensors_into_an_empty_model(sharded):
    model, folder = sharded
    empty = empty_model()
    load_checkpoint_in_model(empty, folder, device_map={"": "cpu"})
    assert all(not t.is_meta for t in empty.state_dict().values())
    assert empty.head.weight is empty.emb.weight  # tied again after loading
    assert torch.equal(empty(IDS), model(IDS))


def test_single_files_torch_and_safetensors(tmp_path):
    model = trained_model()
    torch.save(model.state_dict(), tmp_path / "weights.bin")
    state = {k: v for k, v in model.state_dict().items() if k != "head.weight"}  # tied: stored once
    save_file(state, tmp_path / "weights.safetensors", metadata={"format": "pt"})
    for name in ("weights.bin", "weights.safetensors"):
        fresh = TinyLM()
        load_checkpoint_in_model(fresh, tmp_path / name)
        assert torch.equal(fresh.eval()(IDS), model(IDS))
        empty = empty_model()
        load_checkpoint_in_model(empty, tmp_path / name, device_map={"": "cpu"})
        assert torch.equal(empty.eval()(IDS), model(IDS))


def test_dtype_casting_and_fp32_modules(sharded):
    model, folder = sharded
    empty = empty_model()
    load_checkpoint_in_model(
        empty, folder, device_map={"": "cpu"}, dtype="float16", keep_in_fp32_modules=["final"]
    )
    assert empty.blocks[0].up.weight.dtype == torch.float16
    assert empty.final.weight.dtype == torch.float32
    assert torch.equal(empty.blocks[0].up.weight, model.blocks[0].up.weight.half())


def test_offload_folder_holds_the_disk_modules(sharded, tmp_path):
    model, folder = sharded
    empty = empty_model()
    device_map = {"emb": "cpu", "blocks.0": "cpu", "blocks.1": "disk", "blocks.2": "disk", "blocks.3": "cpu", "final": "cpu", "head": "cpu"}  # fmt: skip
    load_checkpoint_in_model(empty, folder, device_map=device_map, offload_folder=tmp_path / "off")
    index = json.loads((tmp_path / "off" / "index.json").read_text())
    # parameters go to disk; the buffers of disk modules stay in memory (offload_buffers=False)
    assert "blocks.1.up.weight" in index and "blocks.1.scale" not in index
    assert empty.blocks[1].up.weight.is_meta and not empty.blocks[1].scale.is_meta
    assert not empty.blocks[0].up.weight.is_meta
    with_buffers = empty_model()
    load_checkpoint_in_model(
        with_buffers,
        folder,
        device_map=device_map,
        offload_folder=tmp_path / "off2",
        offload_buffers=True,
    )
    assert "blocks.1.scale" in json.loads((tmp_path / "off2" / "index.json").read_text())


def test_offload_state_dict_gives_the_same_model(sharded):
    model, folder = sharded
    empty = empty_model()
    load_checkpoint_in_model(empty, folder, device_map={"": "cpu"}, offload_state_dict=True)
    assert torch.equal(empty(IDS), model(IDS))


@pytest.mark.parametrize(
    "device_map",
    [
        {"": "cpu"},
        {"emb": "cpu", "blocks": "disk", "final": "cpu", "head": "cpu"},
        {
            "emb": "disk",
            "blocks.0": "cpu",
            "blocks.1": "disk",
            "blocks.2": "cpu",
            "blocks.3": "disk",
            "final": "disk",
            "head": "disk",
        },  # fmt: skip
        "auto",
    ],
)
def test_load_checkpoint_and_dispatch_matches_the_plain_model(sharded, tmp_path, device_map):
    model, folder = sharded
    dispatched = load_checkpoint_and_dispatch(
        empty_model(), folder, device_map=device_map, offload_folder=tmp_path / "off"
    )
    # "auto" on a machine with a GPU puts the whole model there without hooks (as the reference does):
    # the inputs then go to that device, and the GPU's arithmetic is compared with a tolerance.
    device = next(dispatched.parameters()).device if device_map == "auto" else torch.device("cpu")
    ids = IDS.to(device)
    if device.type == "cpu":
        assert torch.equal(dispatched(ids), model(IDS))
    else:
        torch.testing.assert_close(dispatched(ids).cpu(), model(IDS), rtol=1e-4, atol=1e-5)
    assert torch.equal(greedy_generate(dispatched, ids, 5).cpu(), greedy_generate(model, IDS, 5))
    assert find_tied_parameters(dispatched) == [["emb.weight", "head.weight"]]


def test_auto_map_with_little_memory_offloads_to_disk(sharded, tmp_path):
    model, folder = sharded
    dispatched = load_checkpoint_and_dispatch(
        empty_model(),
        folder,
        device_map="sequential",
        max_memory={"cpu": 6000},
        no_split_module_classes=["Block"],
        offload_folder=tmp_path / "off",
    )
    assert "disk" in dispatched.hf_device_map.values()
    assert torch.equal(dispatched(IDS), model(IDS))


def test_bad_inputs_fail_before_anything_is_loaded(sharded, tmp_path):
    model, folder = sharded
    empty = empty_model()
    cases = [
        (dict(device_map={"emb": "cpu", "blokcs": "cpu", "final": "cpu", "head": "cpu"}), ValueError, "does not have"),
        (dict(device_map={"": 3}), ValueError, "do not exist on this machine"),
        (dict(device_map={"emb": "cpu"}), ValueError, "does not give any device"),
        # Accelerate's load_checkpoint_in_model names the first such weight in these words
        (dict(device_map={"emb": "cpu"}), ValueError, r"^\S+ doesn't have any device set\."),
        (dict(device_map={"": "disk"}), ValueError, "please pass along an `offload_folder`"),
        (dict(device_map="fastest"), ValueError, "please choose 'auto', 'balanced'"),
    ]  # fmt: skip
    for kwargs, error, message in cases:
        with pytest.raises(error, match=message):
            load_checkpoint_and_dispatch(empty, folder, **kwargs)
    assert all(p.is_meta for p in empty.parameters())
    # a shard missing from the index
    shard = sorted(folder.glob("model-*.safetensors"))[1]
    os.rename(shard, tmp_path / "moved")
    with pytest.raises(FileNotFoundError, match=f"missing: {shard.name}"):
        load_checkpoint_in_model(empty, folder, device_map={"": "cpu"})
    os.rename(tmp_path / "moved", shard)
    assert all(p.is_meta for p in empty.parameters())
    with pytest.raises(
        ValueError, match="should be the path to a file containing a whole state dict"
    ):
        load_checkpoint_in_model(empty, tmp_path / "nowhere", device_map={"": "cpu"})


def test_mismatched_checkpoints_are_refused_before_loading(tmp_path):
    model = trained_model()
    other = TinyLM(d=8)  # same names, other shapes
    save_model(other, tmp_path / "small")
    empty = empty_model()
    with pytest.raises(
        ValueError,
        match='shapes differ for "blocks.0.down.bias": checkpoint \\[8\\] vs model \\[16\\]',
    ):
        load_checkpoint_in_model(empty, tmp_path / "small", device_map={"": "cpu"})
    assert all(p.is_meta for p in empty.parameters())
    # extra and missing names: strict refuses before loading, else a warning
    state = {k: v for k, v in model.state_dict().items() if not k.startswith("final.")}
    state["extra.weight"] = torch.zeros(2)
    save_model(state, tmp_path / "renamed")
    with pytest.raises(
        RuntimeError,
        match="Missing key\\(s\\).*final.weight(.|\n)*Unexpected key\\(s\\).*extra.weight",
    ):
        load_checkpoint_in_model(empty, tmp_path / "renamed", device_map={"": "cpu"}, strict=True)
    assert all(p.is_meta for p in empty.parameters())
    fresh = TinyLM()
    load_checkpoint_in_model(fresh, tmp_path / "renamed", device_map={"": "cpu"})
    assert torch.equal(fresh.emb.weight, model.emb.weight)


def test_unexpected_keys_are_reported(tmp_path, caplog):
    state = dict(trained_model().state_dict())
    state["extra.weight"] = torch.zeros(2)
    torch.save(state, tmp_path / "w.bin")
    load_checkpoint_in_model(TinyLM(), tmp_path / "w.bin", device_map={"": "cpu"})
    assert "were not used when initializing TinyLM" in caplog.text and "extra.weight" in caplog.text


def test_sharded_load_peak_memory_is_about_one_shard(tmp_path):
    # 6 shards of about 17 MB (d=1024 blocks); the model is about 100 MB in float32. Loading in
    # float16 copies every weight (a cast), so each shard is really read: the peak must stay near
    # the float16 model plus one shard, far below the model in float32 plus its copy.
    code = (
        RSS_SNIPPET
        + f"""
import gc, os, sys, torch
sys.path.insert(0, {os.path.dirname(__file__)!r})
from big_model_helpers import TinyLM
from cadence import init_empty_weights
from cadence.checkpointing import save_model
from cadence.utils import load_checkpoint_in_model
folder = {str(tmp_path / "ckpt")!r}
torch.manual_seed(0)
model = TinyLM(d=1024, n_blocks=6, vocab=64)
save_model(model, folder, max_shard_size="17MB")
size = sum(p.numel() * 4 for p in model.parameters())
expected = model.blocks[3].up.weight.detach().half().clone()
del model; gc.collect()
shards = [f for f in os.listdir(folder) if f.endswith(".safetensors")]
largest = max(os.path.getsize(os.path.join(folder, f)) for f in shards)
with init_empty_weights():
    empty = TinyLM(d=1024, n_blocks=6, vocab=64)
before = rss()
reset_peak()
load_checkpoint_in_model(empty, folder, device_map={{"": "cpu"}}, dtype=torch.float16)
grown = peak() - before
close = torch.equal(empty.blocks[3].up.weight, expected) and empty.blocks[3].up.weight.dtype == torch.float16
print(len(shards), size, largest, grown, close)
"""
    )
    shards, size, largest, grown, close = run_python(code).split()
    shards, size, largest, grown = int(shards), int(size), int(largest), int(grown)
    print(f"peak added {grown} for a float16 model of {size // 2} and a largest shard of {largest}")
    assert shards >= 6 and close == "True"
    assert grown >= size // 2  # the float16 copy is really made
    assert grown <= 1.1 * (size // 2 + largest), (grown, size, largest)


def test_weights_parked_on_disk_while_loading_get_the_dtype_asked_for(tmp_path):
    class Mixed(nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = nn.Parameter(torch.rand(3, 2))
            self.register_buffer("steps", torch.arange(3))

    torch.save(Mixed().state_dict(), tmp_path / "mixed.pt")
    model = Mixed()
    load_checkpoint_in_model(
        model, tmp_path / "mixed.pt", device_map={"": "cpu"}, offload_state_dict=True,
        dtype=torch.float16,
    )  # fmt: skip
    assert model.weight.dtype == torch.float16  # floating weights take the dtype
    assert model.steps.dtype == torch.int64 and model.steps.tolist() == [0, 1, 2]
