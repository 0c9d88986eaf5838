"""Accelerator details the reference's own tests check: prepared objects carry the reference's
`_is_accelerate_prepared` flag, and an unknown attribute of `accelerator.state` is reported as the
`AcceleratorState`'s."""

from __future__ import annotations

import pytest
import torch


def test_prepared_objects_carry_the_reference_flag():
    from cadence import Accelerator

    acc = Accelerator(cpu=True)
    model = torch.nn.Linear(2, 4)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1)
    loader = torch.utils.data.DataLoader(list(range(8)), batch_size=2)
    other = object.__new__(type("Plain", (), {}))
    prepared = acc.prepare(model, optimizer, scheduler, loader, other)
    for obj in prepared[:4]:
        assert getattr(obj, "_is_accelerate_prepared", False) is True, type(obj).__name__
        assert getattr(obj, "_is_cadence_prepared", False) is True, type(obj).__name__
    assert prepared[4] is other and not hasattr(other, "_is_accelerate_prepared")
    assert getattr(optimizer, "_is_accelerate_prepared", False) is False  # the user's own object


def test_unknown_state_attribute_names_accelerator_state():
    from cadence import Accelerator

    acc = Accelerator(cpu=True)
    with pytest.raises(
        AttributeError, match="'AcceleratorState' object has no attribute 'nothing'"
    ):
        _ = acc.state.nothing
    acc.state.something = "value"  # setting a new attribute still works
    assert acc.state.something == "value"
    with pytest.raises(AttributeError, match=r"AcceleratorState\._reset_state\(\)"):
        acc.state._reset_state()
        _ = acc.num_processes


def test_a_dropped_accelerator_is_freed_without_the_garbage_collector():
    import gc
    import weakref

    from cadence import Accelerator

    class Holder:
        def __init__(self):
            self.accelerator = Accelerator(cpu=True)
            loader = torch.utils.data.DataLoader(list(range(16)), batch_size=4)
            self.loader = self.accelerator.prepare_data_loader(loader)
            self.iterator = iter(self.loader)

    holder = Holder()
    assert next(holder.iterator).tolist() == [0, 1, 2, 3]
    refs = [
        weakref.ref(holder.accelerator),
        weakref.ref(holder.loader),
        weakref.ref(holder.loader.gradient_state),
    ]
    gc.disable()  # freed by reference counting alone: no cycle keeps them
    try:
        del holder
        assert [ref() is None for ref in refs] == [True, True, True]
    finally:
        gc.enable()


def test_base_dataloader_belongs_to_each_loader_not_to_the_class():
    from cadence.data_loader import DataLoaderDispatcher, DataLoaderShard, SkipDataLoader

    for cls in (DataLoaderShard, DataLoaderDispatcher, SkipDataLoader):
        loader = cls(range(16), batch_size=4)
        assert isinstance(loader.base_dataloader, torch.utils.data.DataLoader)
        with pytest.raises(AttributeError, match="base_dataloader"):
            _ = cls.base_dataloader


def test_a_pickled_accelerator_calls_back_into_its_copy(tmp_path):
    import pickle

    from cadence import Accelerator
    from cadence.utils import ProjectConfiguration

    config = ProjectConfiguration(project_dir=str(tmp_path), automatic_checkpoint_naming=True)
    acc = Accelerator(cpu=True, project_config=config)
    acc.prepare(torch.utils.data.DataLoader(list(range(8)), batch_size=2))
    copy = pickle.loads(pickle.dumps(acc))
    assert len(copy._dataloaders) == 1
    model = copy.prepare(torch.nn.Linear(2, 2))
    copy.save_state()  # the copy's checkpointer waits and takes state dicts through the copy
    assert (tmp_path / "checkpoints" / "checkpoint_0").is_dir()
    assert copy.logging_dir == acc.logging_dir and model is copy._models[0]


def quantized_model(device_map):
    model = torch.nn.Linear(2, 2)
    model.is_loaded_in_8bit = True  # what transformers sets on a bitsandbytes-quantized model
    model.hf_device_map = device_map
    return model


@pytest.mark.parametrize(
    "device_map, phrase",
    [
        ({"": "cpu"}, "with CPU or disk offload"),
        ({"": "disk"}, "with CPU or disk offload"),
        ({"a": "cpu", "b": 0}, "with CPU or disk offload"),
        ({"": "cuda:1"}, "on a different device than the one you're training on"),
    ],
)
def test_quantized_models_that_cannot_train_here_are_refused(device_map, phrase):
    from cadence import Accelerator

    acc = Accelerator(cpu=True)
    with pytest.raises(ValueError, match=phrase):
        acc.prepare_model(quantized_model(device_map))
    assert acc._models == []  # refused before anything was prepared


@pytest.mark.parametrize("cpu_kernels", [False, True])
@pytest.mark.parametrize("xpu", [False, True])
def test_the_quantization_probes_are_read_where_accelerate_keeps_them(cpu_kernels, xpu):
    """Scripts and Accelerate's tests patch `accelerator.is_bitsandbytes_multi_backend_available`
    and `accelerator.is_xpu_available`: prepare reads those names. An 8-bit model offloaded to the
    CPU trains on the CPU only with bitsandbytes' CPU kernels, and never on XPU (Accelerate's rule)."""
    from unittest import mock

    from cadence import Accelerator

    acc = Accelerator(cpu=True)
    with (
        mock.patch(
            "cadence.accelerator.is_bitsandbytes_multi_backend_available", return_value=cpu_kernels
        ),
        mock.patch("cadence.accelerator.is_xpu_available", return_value=xpu),
    ):
        if cpu_kernels and not xpu:
            model = acc.prepare_model(quantized_model({"": "cpu"}))
            assert acc._models == [model]
        else:
            with pytest.raises(ValueError, match="with CPU or disk offload"):
                acc.prepare_model(quantized_model({"": "cpu"}))


def prepare_quantized_over_two_devices():
    import os

    from cadence import Accelerator

    acc = Accelerator(cpu=True)
    # without the bypass, any model with a multi-device map is refused first (the device_map error)
    os.environ["ACCELERATE_BYPASS_DEVICE_MAP"] = "true"
    try:
        acc.prepare_model(quantized_model({"a": 0, "b": 1}))
    except ValueError as err:
        return str(err)
    finally:
        del os.environ["ACCELERATE_BYPASS_DEVICE_MAP"]
    return None


def test_quantized_model_over_several_devices_is_refused_in_distributed_mode(dist_pool):
    for message in dist_pool(2).run(prepare_quantized_over_two_devices):
        assert message is not None and "on multiple devices in any distributed mode" in message


def test_a_new_accelerator_sets_up_a_partial_state_that_was_reset_alone():
    from cadence import Accelerator, PartialState

    Accelerator(cpu=True)
    PartialState._reset_state()  # AcceleratorState is still there
    assert PartialState._shared_state == {}
    acc = Accelerator(cpu=True)
    assert PartialState._shared_state != {}
    assert PartialState().num_processes == acc.num_processes == 1
    assert acc.state.partial_state.device == acc.device
