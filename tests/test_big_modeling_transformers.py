"""A transformers model (tiny random config, offline) through empty init, load and dispatch, generate.

transformers is an optional test dependency: these tests skip when it is not installed.
"""

import pytest
import torch

transformers = pytest.importorskip("transformers")

from cadence import infer_auto_device_map, init_empty_weights, load_checkpoint_and_dispatch  # noqa: E402
from cadence.utils import find_tied_parameters  # noqa: E402


def tiny_gpt2():
    config = transformers.GPT2Config(
        n_layer=4,
        n_embd=32,
        n_head=2,
        vocab_size=96,
        n_positions=64,
        bos_token_id=95,
        eos_token_id=95,
    )
    torch.manual_seed(0)
    return config, transformers.GPT2LMHeadModel(config).eval()


@pytest.mark.parametrize("on_disk", [False, True])
def test_tiny_gpt2_generates_the_same_tokens_after_dispatch(tmp_path, on_disk):
    config, model = tiny_gpt2()
    model.save_pretrained(tmp_path / "ckpt", max_shard_size="40KB", safe_serialization=True)
    assert (tmp_path / "ckpt" / "model.safetensors.index.json").is_file()
    ids = torch.tensor([[5, 17, 3, 42]])
    settings = dict(max_new_tokens=8, do_sample=False, pad_token_id=0)
    expected = model.generate(ids, **settings)

    with init_empty_weights():
        empty = transformers.GPT2LMHeadModel(config)
    empty.tie_weights()
    empty.eval()  # from_pretrained would do it: no dropout
    assert find_tied_parameters(empty) == [["lm_head.weight", "transformer.wte.weight"]]
    no_split = ["GPT2Block"]
    if on_disk:
        device_map = infer_auto_device_map(
            empty, max_memory={"cpu": "90KB"}, no_split_module_classes=no_split
        )
        assert "disk" in device_map.values()
    else:
        device_map = "auto"
    dispatched = load_checkpoint_and_dispatch(
        empty,
        tmp_path / "ckpt",
        device_map=device_map,
        offload_folder=tmp_path / "offload",
        no_split_module_classes=no_split,
    )
    assert torch.equal(dispatched.generate(ids, **settings), expected)
    assert find_tied_parameters(dispatched) == [["lm_head.weight", "transformer.wte.weight"]]
