"""Sizes, available memory, device maps and the tensor helpers of big-model inference (CPU only)."""

import os
from collections import OrderedDict

import pytest
import torch
from torch import nn

from cadence.utils import (
    check_device_map,
    compute_module_sizes,
    convert_file_size_to_int,
    dtype_byte_size,
    find_tied_parameters,
    get_balanced_memory,
    get_max_layer_size,
    get_max_memory,
    infer_auto_device_map,
    named_module_tensors,
    retie_parameters,
    set_module_tensor_to_device,
)
from cadence.utils.modeling import clean_device_map, get_non_persistent_buffers


class Block(nn.Module):
    def __init__(self, d: int = 10):
        super().__init__()
        self.lin = nn.Linear(d, d)  # d*d + d floats
        self.norm = nn.LayerNorm(d)  # 2d floats
        self.register_buffer("scale", torch.ones(d))  # d floats
        self.register_buffer("cache", torch.zeros(d), persistent=False)

    def forward(self, x):
        return x + self.norm(self.lin(x)) * self.scale


class Tiny(nn.Module):
    def __init__(self, d: int = 10, n: int = 3, vocab: int = 20, tie: bool = True):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.blocks = nn.ModuleList([Block(d) for _ in range(n)])
        self.head = nn.Linear(d, vocab, bias=False)
        if tie:
            self.head.weight = self.emb.weight

    def forward(self, ids):
        x = self.emb(ids)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def test_dtype_byte_sizes_follow_the_bit_width():
    assert dtype_byte_size(torch.float32) == 4
    assert dtype_byte_size(torch.bfloat16) == 2
    assert dtype_byte_size(torch.int64) == 8
    assert dtype_byte_size(torch.uint8) == 1
    assert dtype_byte_size(torch.bool) == 1 / 8
    assert dtype_byte_size(torch.float8_e4m3fn) == 1
    with pytest.raises(ValueError, match="is not a valid dtype"):
        dtype_byte_size("not a dtype")


def test_file_sizes_in_decimal_binary_and_bits():
    assert convert_file_size_to_int(123) == 123
    assert convert_file_size_to_int("1KB") == 1000
    assert convert_file_size_to_int("1KiB") == 1024
    assert convert_file_size_to_int("1.5GB") == 1_500_000_000
    assert convert_file_size_to_int("2MiB") == 2 * 2**20
    assert convert_file_size_to_int("8Mb") == 1_000_000  # megabits
    for bad in ("ten", "5XB", -1, "-3GB"):
        with pytest.raises(ValueError, match="is not in a valid format"):
            convert_file_size_to_int(bad)


def test_module_sizes_count_each_tensor_once_and_respect_dtypes():
    model = Tiny(tie=True)
    sizes = compute_module_sizes(model)
    block = (10 * 10 + 10 + 2 * 10 + 10 + 10) * 4  # lin, norm, scale and the non-persistent cache
    assert sizes["blocks.0"] == block
    assert sizes["blocks.0.lin.weight"] == 400
    assert sizes["emb"] == 20 * 10 * 4
    # the tied head weight is the embedding's: not counted twice
    assert sizes[""] == 3 * block + 800
    half = compute_module_sizes(model, dtype=torch.float16)
    assert half[""] == sizes[""] // 2
    # integer tensors keep their dtype; special_dtypes overrides named tensors
    model.blocks[0].register_buffer("steps", torch.zeros(4, dtype=torch.int64))
    mixed = compute_module_sizes(
        model, dtype="float16", special_dtypes={"emb.weight": torch.float32}
    )
    assert mixed["blocks.0.steps"] == 32
    assert mixed["emb"] == 800


def test_named_module_tensors_and_non_persistent_buffers():
    block = Block()
    names = [n for n, _ in named_module_tensors(block, recurse=True)]
    assert names == ["lin.weight", "lin.bias", "norm.weight", "norm.bias", "scale", "cache"]
    persistent = [n for n, _ in named_module_tensors(block, remove_non_persistent=True)]
    assert persistent == ["scale"]
    assert [n for n, _ in named_module_tensors(block, include_buffers=False)] == []
    assert get_non_persistent_buffers(block) == {"cache"}


def test_max_layer_size_opens_modules_unless_unsplittable():
    model = Tiny(tie=False)
    sizes = compute_module_sizes(model)
    children = list(model.named_children())
    assert get_max_layer_size(children, sizes, []) == (800, ["emb", "head"])
    assert get_max_layer_size(children, sizes, ["Block"]) == (800, ["emb", "head"])
    wide = Tiny(d=40, vocab=2, tie=False)
    wide_sizes = compute_module_sizes(wide)
    size, names = get_max_layer_size(list(wide.named_children()), wide_sizes, ["Block"])
    assert (size, names) == (wide_sizes["blocks.0"], ["blocks.0", "blocks.1", "blocks.2"])


def test_max_memory_reads_real_free_memory_and_validates_keys():
    found = get_max_memory()
    assert set(found) >= {"cpu"}
    # the CPU entry is the available memory, as the kernel reports it
    with open("/proc/meminfo") as f:
        available = next(
            int(line.split()[1]) * 1024 for line in f if line.startswith("MemAvailable")
        )
    assert abs(found["cpu"] - available) < 0.2 * available
    assert get_max_memory({"disk": "1GB", "cpu": "2GiB"}) == {"cpu": 2 * 2**30, "disk": 10**9}
    assert list(get_max_memory({"cpu": 1, 0: 5})) == [0, "cpu"]
    with pytest.raises(ValueError, match="Device gpu is not recognized"):
        get_max_memory({"gpu": 100})


def test_balanced_memory_without_gpus_is_the_max_memory():
    assert get_balanced_memory(Tiny(), max_memory={"cpu": 5000}) == {"cpu": 5000}


def test_auto_device_map_fills_cpu_then_disk_keeping_room_for_the_biggest_layer():
    model = nn.Sequential(*[nn.Linear(100, 100) for _ in range(5)])  # 40400 bytes each
    # room for 2 layers plus the reserved biggest one: 3 * 40400 = 121200
    assert infer_auto_device_map(model, max_memory={"cpu": 121200}) == {
        "0": "cpu",
        "1": "cpu",
        "2": "disk",
        "3": "disk",
        "4": "disk",
    }
    assert infer_auto_device_map(model, max_memory={"cpu": 10**9}) == {"": "cpu"}
    # bfloat16 halves every layer: 5 fit with the reserve in 6 halves
    assert infer_auto_device_map(model, max_memory={"cpu": 6 * 20200}, dtype=torch.bfloat16) == {
        "": "cpu"
    }


def test_auto_device_map_splits_modules_but_not_unsplittable_ones():
    model = Tiny(tie=False)
    sizes = compute_module_sizes(model)
    limit = sizes["emb"] + 800 + sizes["blocks.0"] + sizes["blocks.1.lin"] + 10
    split = infer_auto_device_map(model, max_memory={"cpu": limit})
    # blocks.1 is opened up: its linear fits, the rest goes to disk
    assert split["emb"] == "cpu" and split["blocks.0"] == "cpu" and split["blocks.1.lin"] == "cpu"
    assert split["blocks.1.norm"] == "disk" and split["head"] == "disk"
    whole = infer_auto_device_map(
        model, max_memory={"cpu": limit}, no_split_module_classes=["Block"]
    )
    assert whole["blocks.1"] == "disk" and "blocks.1.lin" not in whole
    check_device_map(model, split)
    check_device_map(model, whole)


def test_auto_device_map_keeps_tied_weights_together():
    model = Tiny(tie=True)
    device_map = infer_auto_device_map(model, max_memory={"cpu": 2000})
    assert device_map["emb"] == device_map["head"]


def test_clean_device_map_merges_entries_on_one_device():
    messy = OrderedDict([("a.0", "cpu"), ("a.1", "cpu"), ("b.x", 0), ("b.y", "disk")])
    assert clean_device_map(messy) == {"a": "cpu", "b.x": 0, "b.y": "disk"}
    assert clean_device_map({"a": "cpu", "b": "cpu"}) == {"": "cpu"}


def test_check_device_map_names_the_uncovered_tensors():
    model = Tiny()
    with pytest.raises(
        ValueError, match="does not give any device for the following parameters: .*blocks.2"
    ):
        check_device_map(model, {"emb": "cpu", "blocks.0": "cpu", "blocks.1": "cpu", "head": "cpu"})


def test_tied_parameters_are_found_and_retied():
    model = Tiny(tie=True)
    assert find_tied_parameters(model) == [["emb.weight", "head.weight"]]
    assert find_tied_parameters(Tiny(tie=False)) == []
    model.head.weight = nn.Parameter(torch.zeros(20, 10, device="meta"))
    retie_parameters(model, [["emb.weight", "head.weight"]])
    # the tensor holding data wins over the meta one
    assert model.head.weight is model.emb.weight and model.head.weight.device.type == "cpu"


def test_set_module_tensor_to_device_moves_fills_and_checks():
    model = Tiny(tie=False).to("meta")
    value = torch.arange(100.0).reshape(10, 10)
    set_module_tensor_to_device(model, "blocks.0.lin.weight", "cpu", value=value)
    weight = model.blocks[0].lin.weight
    assert isinstance(weight, nn.Parameter) and weight.requires_grad and torch.equal(weight, value)
    set_module_tensor_to_device(
        model, "blocks.0.scale", "cpu", value=torch.full((10,), 2.0), dtype=torch.float16
    )
    assert model.blocks[0].scale.dtype == torch.float16 and not isinstance(
        model.blocks[0].scale, nn.Parameter
    )
    # integers are never cast; without a dtype the module's dtype wins
    set_module_tensor_to_device(
        model, "emb.weight", "cpu", value=torch.ones(20, 10, dtype=torch.float64)
    )
    assert model.emb.weight.dtype == torch.float32
    with pytest.raises(ValueError, match="is on the meta device, we need a `value`"):
        set_module_tensor_to_device(model, "head.weight", "cpu")
    with pytest.raises(ValueError, match="Trying to set a tensor of shape"):
        set_module_tensor_to_device(model, "head.weight", "cpu", value=torch.zeros(3))
    with pytest.raises(ValueError, match="does not have a parameter or a buffer named nope"):
        set_module_tensor_to_device(model, "head.nope", "cpu", value=torch.zeros(3))
    with pytest.raises(ValueError, match="has no attribute missing"):
        set_module_tensor_to_device(model, "missing.weight", "cpu", value=torch.zeros(3))
    set_module_tensor_to_device(model, "blocks.0.lin.weight", "meta")
    assert model.blocks[0].lin.weight.is_meta


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_set_module_tensor_to_a_gpu_index():
    model = nn.Linear(2, 2)
    set_module_tensor_to_device(model, "weight", 0)
    assert model.weight.device == torch.device("cuda", 0)


def test_import_cadence_does_not_load_the_big_model_modules():
    import subprocess
    import sys

    code = "import cadence, sys; print(any(m.startswith('cadence.bigmodel') for m in sys.modules))"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=dict(os.environ)
    )
    assert out.stdout.strip() == "False", out.stderr


def _buffered_model() -> nn.Module:
    """Three layers with extra buffers: sizes 144, 192 and 220 bytes (parameters and buffers)."""
    model = nn.Sequential(
        OrderedDict(
            [
                ("linear1", nn.Linear(3, 4)),
                ("norm", nn.BatchNorm1d(4)),
                ("linear2", nn.Linear(4, 5)),
            ]
        )
    )
    model.linear1.register_buffer("extra", torch.zeros(10, 2))  # 80 bytes
    model.norm.register_buffer("extra", torch.zeros(10, 3))  # 120 bytes (+ 40 of running stats)
    model.linear2.register_buffer("extra", torch.zeros(10, 3))  # 120 bytes
    return model


def test_offloaded_buffers_that_fit_no_gpu_are_a_warning():
    import warnings

    from cadence.utils import infer_auto_device_map

    model = _buffered_model()
    # GPU 0 keeps room for the biggest layer (220): only linear1 (144) goes there; the buffers of the
    # offloaded norm and linear2 (160 + 120) do not fit in what is left of it.
    with pytest.warns(UserWarning, match="offload_buffers=True"):
        device_map = infer_auto_device_map(model, max_memory={0: 400, "cpu": "1GB"})
    assert device_map == {"linear1": 0, "norm": "cpu", "linear2": "cpu"}
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # offload_buffers=True: nothing to warn about
        assert (
            infer_auto_device_map(model, max_memory={0: 400, "cpu": "1GB"}, offload_buffers=True)
            == device_map
        )


def test_a_device_that_gets_nothing_is_reported(caplog):
    import logging

    from cadence.utils import infer_auto_device_map

    model = nn.Sequential(OrderedDict([("big", nn.Linear(10, 10)), ("small", nn.Linear(2, 2))]))
    with caplog.at_level(logging.INFO):
        device_map = infer_auto_device_map(model, max_memory={0: 100, "cpu": "1GB"})
    assert device_map == {"": "cpu"}
    notes = [r.getMessage() for r in caplog.records if "insufficient memory" in r.getMessage()]
    assert len(notes) == 1 and "0 needs at least" in notes[0]


def test_check_device_map_warns_about_names_that_are_not_in_the_model():
    from cadence.utils import check_device_map

    model = _buffered_model()
    with pytest.warns(UserWarning, match="do not match any submodules") as caught:
        check_device_map(model, {"linear1": "cpu", "norm": "cpu", "linear2": "cpu", "lienar3": 0})
    assert "lienar3" in str(caught[0].message)
    with pytest.raises(ValueError, match="linear2"), pytest.warns(UserWarning):
        check_device_map(model, {"linear1": "cpu", "norm": "cpu", "typo": "cpu"})
