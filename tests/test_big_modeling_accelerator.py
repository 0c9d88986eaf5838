"""The Accelerator with a dispatched model: no distributed training, full weights when saving."""

import tempfile

import torch
from big_model_helpers import TinyLM, trained_model
from safetensors.torch import load_file
from torch.utils.data import DataLoader

from cadence import Accelerator, dispatch_model

IDS = torch.tensor([[1, 5, 7, 2], [3, 3, 9, 30]])
DEVICE_MAP = {"emb": "cpu", "blocks.0": "cpu", "blocks.1": "disk", "blocks.2": "cpu", "blocks.3": "disk", "final": "cpu", "head": "cpu"}  # fmt: skip


def dispatched(folder: str) -> TinyLM:
    model = TinyLM()
    model.load_state_dict(trained_model().state_dict())
    return dispatch_model(model.eval(), DEVICE_MAP, offload_dir=folder)


def test_single_process_prepare_keeps_the_dispatched_model(tmp_path):
    accelerator = Accelerator(cpu=True)
    model = dispatched(str(tmp_path / "off"))
    assert accelerator.verify_device_map(model)
    assert not accelerator.verify_device_map(trained_model())
    prepared = accelerator.prepare(model)
    # not moved to the device (an offloaded model cannot be): the hooks still stream the weights
    assert prepared.blocks[1].up.weight.is_meta
    with torch.no_grad():
        assert torch.equal(prepared(IDS), trained_model()(IDS))


def test_save_model_of_an_offloaded_model_writes_the_full_weights(tmp_path):
    accelerator = Accelerator(cpu=True)
    model = accelerator.prepare(dispatched(str(tmp_path / "off")))
    accelerator.save_model(model, tmp_path / "saved")
    saved = load_file(tmp_path / "saved" / "model.safetensors")
    expected = trained_model().state_dict()
    assert set(expected) - set(saved) <= {"head.weight"}  # the tied copy is stored once
    for name, tensor in saved.items():
        assert torch.equal(tensor, expected[name]), name
    assert model.blocks[1].up.weight.is_meta  # offloaded again after saving


def check_distributed_prepare_refuses_a_dispatched_model():
    accelerator = Accelerator(cpu=True)
    with tempfile.TemporaryDirectory() as folder:
        model = dispatched(folder)
        loader = DataLoader(list(range(8)), batch_size=2)
        try:
            accelerator.prepare(loader, model)
        except ValueError as e:
            message = str(e)
        else:
            message = "no error"
        try:
            accelerator.prepare_model(model)
        except ValueError as e:
            direct = str(e)
        else:
            direct = "no error"
        # the check comes before anything is prepared
        return message, direct, len(accelerator._dataloaders), len(accelerator._models)


def test_distributed_prepare_refuses_a_dispatched_model(dist_pool):
    for message, direct, loaders, models in dist_pool(2).run(
        check_distributed_prepare_refuses_a_dispatched_model
    ):
        assert (
            "You can't train a model that has been loaded with `device_map='auto'` in any distributed mode"
            in message
        )
        assert "--num_processes=1" in message
        assert direct in message  # prepare() names the rank first
        assert (loaders, models) == (0, 0)


def check_distributed_prepare_of_a_one_device_map():
    accelerator = Accelerator(cpu=True)
    model = dispatch_model(trained_model(), {"": "cpu"})
    prepared = accelerator.prepare(model)
    return type(prepared).__name__


def test_a_one_entry_device_map_can_still_be_trained(dist_pool):
    # the reference only refuses maps of more than one entry
    assert (
        dist_pool(2).run(check_distributed_prepare_of_a_one_device_map)
        == ["DistributedDataParallel"] * 2
    )
