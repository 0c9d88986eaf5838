"""Model, process and tensor helpers of the public API (cadence.utils.other / .operations)."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

from cadence.utils import (
    check_os_kernel,
    clean_state_dict_for_safetensors,
    compile_regions,
    convert_bytes,
    convert_outputs_to_fp32,
    convert_to_fp32,
    extract_model_from_parallel,
    find_device,
    get_module_children_bottom_up,
    get_pretty_name,
    has_compiled_regions,
    is_compiled_module,
    is_port_in_use,
    listify,
    merge_dicts,
    pad_input_tensors,
    recursive_getattr,
)
from cadence.utils.operations import ConvertOutputsToFp32, get_shape
from cadence.utils.other import get_free_port


def test_extract_model_from_data_parallel_and_compile():
    inner = torch.nn.Linear(2, 2)
    assert extract_model_from_parallel(torch.nn.DataParallel(inner)) is inner
    compiled = torch.compile(torch.nn.DataParallel(inner))
    assert is_compiled_module(compiled)
    kept = extract_model_from_parallel(compiled, keep_torch_compile=True)
    assert kept is compiled and kept._orig_mod is inner  # the container was stripped inside
    assert (
        extract_model_from_parallel(
            torch.compile(torch.nn.DataParallel(inner)), keep_torch_compile=False
        )
        is inner
    )


def test_extract_model_recursive_unwraps_children():
    inner = torch.nn.Linear(2, 2)
    outer = torch.nn.Sequential(torch.nn.DataParallel(inner))
    assert extract_model_from_parallel(outer, recursive=True)[0] is inner


def test_extract_model_removes_the_fp32_wrapper_on_request():
    model = torch.nn.Linear(2, 2)
    from cadence.precision.policy import remove_forward_wrapper  # noqa: F401  (the wrapper Cadence adds)

    model._cadence_original_forward = model.forward
    model.forward = convert_outputs_to_fp32(model.forward)
    assert hasattr(model.forward, "_cadence_wrapped_forward")
    extract_model_from_parallel(model, keep_fp32_wrapper=False)
    assert not hasattr(model.forward, "_cadence_wrapped_forward")


def test_compile_regions_compiles_each_repeated_block():
    blocks = torch.nn.ModuleList([torch.nn.Linear(2, 2) for _ in range(3)])
    model = torch.nn.Sequential(torch.nn.Linear(2, 2))
    model.blocks = blocks
    compiled = compile_regions(model)
    assert compiled._orig_mod is model and has_compiled_regions(compiled)
    assert all(is_compiled_module(block) for block in compiled.blocks)
    assert extract_model_from_parallel(compiled, keep_torch_compile=False) is model


def test_small_generic_helpers():
    assert get_pretty_name(torch.nn.Linear(1, 1)) == "Linear"
    assert get_pretty_name(torch.nn.Linear) == "Linear"
    assert merge_dicts({"a": {"b": 1}, "c": 2}, {"a": {"d": 3}}) == {"a": {"d": 3, "b": 1}, "c": 2}
    net = torch.nn.Sequential(torch.nn.Linear(1, 2))
    assert recursive_getattr(net, "0.out_features") == 2
    assert convert_bytes(1536) == "1.5 KB" and convert_bytes(10) == "10 bytes"
    assert convert_bytes(3 * 1024**5) == "3.0 PB"


def test_children_bottom_up_order():
    net = torch.nn.Sequential(torch.nn.Sequential(torch.nn.Linear(1, 1)), torch.nn.ReLU())
    named = get_module_children_bottom_up(net, return_fqns=True)
    names = [name for name, _ in named]
    assert names[-1] == "" and names.index("0.0") < names.index("0")
    assert set(names) == {"", "0", "0.0", "1"}
    assert get_module_children_bottom_up(net)[-1] is net


def test_clean_state_dict_drops_aliases_and_makes_contiguous():
    weight = torch.ones(2, 3)
    cleaned = clean_state_dict_for_safetensors(
        {"a": weight, "b": weight, "c": torch.ones(3, 2).t()}
    )
    assert sorted(cleaned) == ["a", "c"] and cleaned["c"].is_contiguous()


def test_ports_and_kernel_check():
    port = get_free_port()
    assert 0 < port < 65536 and not is_port_in_use(port)
    import socket

    with socket.socket() as server:
        server.bind(("localhost", 0))
        server.listen()
        assert is_port_in_use(server.getsockname()[1])
    check_os_kernel()  # warns only on old Linux kernels; must not raise


def test_fp32_conversions():
    half = {
        "x": torch.ones(2, dtype=torch.half),
        "y": [torch.ones(1, dtype=torch.bfloat16)],
        "n": 3,
    }
    converted = convert_to_fp32(half)
    assert (
        converted["x"].dtype == torch.float32
        and converted["y"][0].dtype == torch.float32
        and converted["n"] == 3
    )

    def forward(x):
        return x.half() * 2

    assert convert_outputs_to_fp32(forward)(torch.ones(1)).dtype == torch.float32
    wrapped = ConvertOutputsToFp32(forward)
    assert wrapped(torch.ones(1)).dtype == torch.float32 and wrapped.__name__ == "forward"


def test_tensor_structure_helpers():
    assert listify({"a": torch.tensor([1, 2]), "b": torch.tensor(1.5, dtype=torch.bfloat16)}) == {
        "a": [1, 2],
        "b": 1.5,
    }
    assert (
        find_device([1, {"k": torch.ones(1)}]) == torch.device("cpu") and find_device([1]) is None
    )
    assert get_shape({"a": torch.ones(2, 3)}) == {"a": [2, 3]}
    # The reference's documented example: 3 rows for 4 processes become 4.
    assert pad_input_tensors(torch.ones(3, 4, 4), batch_size=3, num_processes=4).shape == (4, 4, 4)
    padded = pad_input_tensors(torch.arange(5.0).reshape(5, 1), batch_size=5, num_processes=2)
    assert (
        padded.shape == (6, 1)
        and padded[:5].flatten().tolist() == [0, 1, 2, 3, 4]
        and padded[5].item() == 0
    )


# -- across real processes ------------------------------------------------------------------
def save_load_on_processes(directory):
    from cadence.state import PartialState
    from cadence.utils import load, save, wait_for_everyone

    state = PartialState()
    path = os.path.join(directory, "obj.pt")
    # A uint32 numpy array, as numpy RNG states hold.
    save(
        {"w": torch.full((2,), float(state.process_index)), "rng": np.arange(3, dtype=np.uint32)},
        path,
    )
    wait_for_everyone()
    loaded = load(path)
    return loaded["w"].tolist(), loaded["rng"].tolist()


def test_save_writes_once_and_load_reads_numpy_weights_only(dist_pool, tmp_path):
    results = dist_pool(2).run(save_load_on_processes, str(tmp_path))
    # Only the main process wrote: both read its tensor of zeros.
    assert results == [([0.0, 0.0], [0, 1, 2])] * 2


def copy_from_main():
    from cadence.state import PartialState
    from cadence.utils import copy_tensor_to_devices

    state = PartialState()
    tensor = torch.arange(6.0).reshape(2, 3) if state.is_main_process else None
    return copy_tensor_to_devices(tensor).tolist()


def test_copy_tensor_to_devices_sends_the_main_process_tensor(dist_pool):
    assert dist_pool(2).run(copy_from_main) == [[[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]]] * 2


def local_sgd_run(steps):
    from cadence import Accelerator
    from cadence.local_sgd import LocalSGD
    from cadence.utils import gather

    accelerator = Accelerator(cpu=True)
    torch.manual_seed(0)
    model = torch.nn.Linear(1, 1, bias=False)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer = accelerator.prepare(model, optimizer)
    inner = accelerator.unwrap_model(model)
    history = []
    x = torch.tensor([[accelerator.process_index + 1.0]])
    with LocalSGD(accelerator=accelerator, model=model, local_sgd_steps=steps) as local_sgd:
        for _ in range(3):
            accelerator.backward(model(x).sum())
            optimizer.step()
            optimizer.zero_grad()
            local_sgd.step()
            history.append(gather(inner.weight.detach().reshape(1)).tolist())
    final = gather(inner.weight.detach().reshape(1)).tolist()
    return history, final


def test_local_sgd_averages_every_k_steps_and_on_exit(dist_pool):
    history, final = dist_pool(2).run(local_sgd_run, 2)[0]
    differs = [abs(weights[0] - weights[1]) > 1e-7 for weights in history]
    # Step 1: local updates differ (different data); step 2: averaged; step 3: differ again.
    assert differs == [True, False, True]
    assert abs(final[0] - final[1]) < 1e-7  # leaving the block averages once more


def test_local_sgd_refuses_zero_steps():
    from cadence import Accelerator
    from cadence.local_sgd import LocalSGD

    accelerator = Accelerator(cpu=True)
    with pytest.raises(ValueError, match="local_sgd_steps"):
        LocalSGD(accelerator, torch.nn.Linear(1, 1), local_sgd_steps=0)
