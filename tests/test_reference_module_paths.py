"""Behaviour behind the reference's module paths: command entry points and parsers, config
helpers, launch-environment helpers, FSDP/DeepSpeed helpers, and the names of features Cadence
does not drive (they import, and raise a clear error when used)."""

from __future__ import annotations

import argparse
import os

import pytest
import torch


def test_write_basic_config_through_the_reference_paths(tmp_path):
    import yaml

    from cadence.commands.config import default_config_file
    from cadence.commands.config.default import write_basic_config
    from cadence.utils import write_basic_config as from_utils

    assert from_utils is write_basic_config
    target = tmp_path / "config.yaml"
    assert str(write_basic_config(mixed_precision="bf16", save_location=str(target))) == str(target)
    written = yaml.safe_load(target.read_text())
    assert (
        written["mixed_precision"] == "bf16" and written["compute_environment"] == "LOCAL_MACHINE"
    )
    assert write_basic_config(save_location=str(target)) is False  # never overwrites
    assert default_config_file.endswith(os.path.join("cadence", "default_config.yaml"))


def test_config_parsers_and_loading(tmp_path):
    from cadence.commands.config import get_config_parser, load_config_from_file
    from cadence.commands.config.default import write_basic_config

    args = get_config_parser().parse_args(["default", "--mixed_precision", "fp16"])
    assert args.mixed_precision == "fp16" and callable(args.func)
    path = tmp_path / "c.yaml"
    write_basic_config(save_location=str(path))
    assert load_config_from_file(str(path)).num_processes >= 1

    root = argparse.ArgumentParser()
    sub = root.add_subparsers()
    from cadence.commands.config.default import default_command_parser
    from cadence.commands.config.update import update_command_parser

    default_command_parser(sub, parents=[])
    update_command_parser(sub, parents=[])
    assert set(sub.choices) == {"default", "update"}


def test_launch_env_and_test_parsers():
    from cadence.commands.env import env_command_parser
    from cadence.commands.launch import clean_option, launch_command_parser
    from cadence.commands.merge import merge_command_parser
    from cadence.commands.test import test_command_parser

    args = launch_command_parser().parse_args(
        ["--num_processes", "2", "--cpu", "train.py", "--lr", "1"]
    )
    assert args.num_processes == 2 and args.training_script == "train.py"
    assert env_command_parser().parse_args([]).config_file is None
    assert test_command_parser().parse_args(["--config_file", "x.yaml"]).config_file == "x.yaml"
    assert merge_command_parser().parse_args(["in", "out"]).output_path == "out"
    assert clean_option("--num-processes") == "num_processes" and clean_option("x") is None


def test_custom_argument_parser_takes_both_spellings():
    from cadence.commands.utils import CustomArgumentParser

    parser = CustomArgumentParser()
    parser.add_argument("--num_processes", type=int)
    group = parser.add_argument_group("g")
    group.add_argument("--main_process_port", type=int)
    args = parser.parse_args(["--num-processes", "2", "--main-process-port", "5"])
    assert (args.num_processes, args.main_process_port) == (2, 5)


def test_to_fsdp2_conversion(tmp_path):
    import yaml

    from cadence.commands.to_fsdp2 import (
        convert_config_to_fsdp2,
        to_fsdp2_command,
        to_fsdp2_command_parser,
    )

    fsdp1 = {
        "fsdp_config": {
            "fsdp_sharding_strategy": "SHARD_GRAD_OP",
            "fsdp_backward_prefetch": "BACKWARD_PRE",
            "fsdp_forward_prefetch": True,
            "fsdp_offload_params": False,
            "fsdp_unknown_key": 1,
        }
    }
    converted = convert_config_to_fsdp2(fsdp1)["fsdp_config"]
    assert converted == {
        "fsdp_reshard_after_forward": False,
        "fsdp_offload_params": False,
        "fsdp_unknown_key": 1,
        "fsdp_version": 2,
    }
    assert convert_config_to_fsdp2({"fsdp_config": {"fsdp_version": 2}}) == {
        "fsdp_config": {"fsdp_version": 2}
    }
    source = tmp_path / "c.yaml"
    source.write_text(yaml.safe_dump({"fsdp_config": {"fsdp_sharding_strategy": "FULL_SHARD"}}))
    args = to_fsdp2_command_parser().parse_args(
        ["--config_file", str(source), "--output_file", str(tmp_path / "o.yaml")]
    )
    to_fsdp2_command(args)
    assert (
        yaml.safe_load((tmp_path / "o.yaml").read_text())["fsdp_config"][
            "fsdp_reshard_after_forward"
        ]
        is True
    )
    with pytest.raises(ValueError, match="--output_file"):
        to_fsdp2_command(
            argparse.Namespace(config_file=str(source), overwrite=False, output_file=None)
        )


def test_estimate_memory_arithmetic_and_table():
    from cadence.commands.estimate import (
        add_timm_hub_prefix,
        create_ascii_table,
        estimate_training_usage,
    )

    assert estimate_training_usage(100, "float32") == {
        "model": 100,
        "optimizer": 200,
        "gradients": 100,
        "step": 400,
    }
    assert estimate_training_usage(100, "bfloat16") == {
        "model": 100,
        "optimizer": 200,
        "gradients": 150,
        "step": 200,
    }
    assert estimate_training_usage(100, "int4")["model"] == -1
    table = create_ascii_table(
        ["dtype", "size"], [["float32", "1 GB"], ["int4", "128 MB"]], "Memory"
    )
    lines = table.splitlines()
    assert len({len(line) for line in lines}) == 1 and "Memory" in lines[1] and "float32" in table
    assert (
        add_timm_hub_prefix("timm/resnet") == "hf-hub:timm/resnet"
        and add_timm_hub_prefix("resnet") == "resnet"
    )


def test_prepare_for_launch_sets_ranks(monkeypatch):
    from cadence.utils import PrepareForLaunch
    from cadence.utils.launch import env_var_path_add

    seen = {}
    for name in ("RANK", "LOCAL_RANK", "FORK_LAUNCHED"):  # recorded, so restored after the test
        monkeypatch.setenv(name, "0")
    monkeypatch.setenv("NPROC", "2")
    monkeypatch.setenv("NODE_RANK", "1")
    PrepareForLaunch(lambda x: seen.update(value=x, rank=os.environ["RANK"]), "MULTI_CPU")(1, "arg")
    assert seen == {"value": "arg", "rank": "3"} and os.environ["LOCAL_RANK"] == "1"
    monkeypatch.setenv("CADENCE_T_PATH", "/a::/b")
    assert env_var_path_add("CADENCE_T_PATH", "/c") == "/a:/b:/c"


def test_fsdp_helpers(monkeypatch):
    from cadence.utils import (
        disable_fsdp_ram_efficient_loading,
        enable_fsdp_ram_efficient_loading,
        fsdp2_canonicalize_names,
        fsdp2_switch_optimizer_parameters,
    )
    from cadence.utils.dataclasses import get_module_class_from_name

    for name in (
        "ACCELERATE_USE_FSDP",
        "FSDP_CPU_RAM_EFFICIENT_LOADING",
    ):  # recorded, so restored after
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)
    enable_fsdp_ram_efficient_loading()
    assert (
        os.environ["FSDP_CPU_RAM_EFFICIENT_LOADING"] == "True"
        and os.environ["ACCELERATE_USE_FSDP"] == "True"
    )
    disable_fsdp_ram_efficient_loading()
    assert os.environ["FSDP_CPU_RAM_EFFICIENT_LOADING"] == "False"
    names = {"_orig_mod.block._checkpoint_wrapped_module.w": 1, "a._orig_mod.b": 2}
    assert fsdp2_canonicalize_names(names) == {"block.w": 1, "a.b": 2}
    old, new = torch.nn.Parameter(torch.ones(1)), torch.nn.Parameter(torch.zeros(1))
    optimizer = torch.optim.SGD([old], lr=0.1)
    fsdp2_switch_optimizer_parameters(optimizer, {old.data_ptr: new})
    assert optimizer.param_groups[0]["params"][0] is new
    with pytest.raises(KeyError, match="sharded version"):
        fsdp2_switch_optimizer_parameters(optimizer, {})
    assert get_module_class_from_name(torch.nn.Sequential(torch.nn.ReLU()), "ReLU") is torch.nn.ReLU
    assert get_module_class_from_name(torch.nn.Linear(1, 1), "Conv2d") is None


def test_deepspeed_plugin_lookup_refuses_without_deepspeed():
    from cadence import Accelerator
    from cadence.utils import get_active_deepspeed_plugin

    accelerator = Accelerator(cpu=True)
    with pytest.raises(ValueError, match="Couldn't retrieve the active `DeepSpeedPlugin`"):
        get_active_deepspeed_plugin(accelerator.state)


def test_state_and_optimizer_module_names():
    from cadence import Accelerator
    from cadence.optimizer import move_to_device, patch_optimizer_step
    from cadence.state import ThreadLocalSharedDict, do_nothing, is_initialized

    assert not is_initialized()
    Accelerator(cpu=True)
    assert is_initialized()
    shared = ThreadLocalSharedDict()
    shared["k"] = 1
    assert shared.get("k") == 1 and "k" in shared and do_nothing(1, x=2) is None
    assert move_to_device({"s": [torch.ones(1)]}, "cpu")["s"][0].device.type == "cpu"

    class Holder:
        pass

    holder = Holder()
    assert (
        patch_optimizer_step(holder, lambda: "stepped")() == "stepped"
        and holder._accelerate_step_called
    )


def test_custom_state_round_trip(tmp_path):
    from cadence.checkpointing import load_custom_state, save_custom_state

    class Counter:
        def __init__(self, value):
            self.value = value

        def state_dict(self):
            return {"value": self.value}

        def load_state_dict(self, state):
            self.value = state["value"]

    save_custom_state(Counter(5), tmp_path, index=1)
    assert (tmp_path / "custom_checkpoint_1.pkl").is_file()
    restored = Counter(0)
    load_custom_state(restored, tmp_path, index=1)
    assert restored.value == 5


def test_fp8_recipe_kwargs_validate():
    from cadence.utils import MSAMPRecipeKwargs, TERecipeKwargs, is_transformer_engine_available

    with pytest.raises(ValueError, match="opt_level"):
        MSAMPRecipeKwargs(opt_level="O3")
    if not is_transformer_engine_available():
        # As in the reference, the Transformer Engine recipe needs its package.
        with pytest.raises(ImportError, match="Transformer Engine"):
            TERecipeKwargs(fp8_format="e4m3")
        return
    recipe = TERecipeKwargs(fp8_format="e4m3")
    assert recipe.fp8_format == "E4M3" and recipe.amax_history_len == 1024 and recipe.margin == 0
    with pytest.raises(ValueError, match="fp8_format"):
        TERecipeKwargs(fp8_format="E3M4")


def test_bnb_config_validates():
    from cadence.utils import BnbQuantizationConfig

    config = BnbQuantizationConfig(load_in_4bit=True, bnb_4bit_compute_dtype="bf16")
    assert config.bnb_4bit_compute_dtype == torch.bfloat16 and config.torch_dtype == torch.float32
    with pytest.raises(ValueError, match="can't be both True"):
        BnbQuantizationConfig(load_in_8bit=True, load_in_4bit=True)


def test_torchao_layer_selection():
    from cadence.utils.ao import (
        filter_first_and_last_linear_layers,
        filter_linear_layers,
        find_first_last_linear_layers,
    )

    model = torch.nn.Sequential(
        torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 32), torch.nn.Linear(32, 8)
    )
    assert find_first_last_linear_layers(model) == ("0", "3")
    assert filter_linear_layers(model[2], "2", ["0", "3"]) is True
    assert filter_linear_layers(model[3], "3", []) is False  # 8 outputs: not a multiple of 16
    assert filter_linear_layers(model[0], "0", ["0"]) is False
    assert filter_first_and_last_linear_layers(torch.nn.Linear(16, 16), "") is False


UNSUPPORTED = [
    ("cadence.utils", "megatron_lm_initialize", (None,), "Megatron-LM"),
    ("cadence.utils.megatron_lm", "MegatronEngine", (None, None, None, None), "Megatron-LM"),
    ("cadence.utils", "load_and_quantize_model", (None, None), "bitsandbytes"),
    ("cadence.utils", "convert_model", (None,), "Transformer Engine"),
    ("cadence.utils", "install_xla", (), "TPU"),
    ("cadence.utils", "prepare_sagemager_args_inputs", (None, None), "SageMaker"),
    ("cadence.utils", "set_numa_affinity", (0,), "numactl"),
    ("cadence.test_utils.training", "mocked_dataloaders", (None,), "MRPC"),
]


def test_prepare_tpu_builds_the_references_tpu_environment():
    import argparse

    from cadence.utils import prepare_tpu

    args, env = prepare_tpu(argparse.Namespace(mixed_precision="no", debug=True), {})
    assert env == {"ACCELERATE_DEBUG_MODE": "true"}  # bf16 switches only on a TPU
    pod_args = argparse.Namespace(mixed_precision="no", debug=False, tpu_vm=["a"], tpu_name="pod")
    args, env = prepare_tpu(pod_args, {}, pod=True)
    assert (args.vm, args.tpu, env) == (["a"], "pod", {})


@pytest.mark.parametrize(("module", "name", "args", "named"), UNSUPPORTED)
def test_unsupported_names_import_and_raise_a_clear_error(module, name, args, named):
    import importlib

    function = getattr(importlib.import_module(module), name)
    with pytest.raises(NotImplementedError, match=named):
        function(*args)


def _write_rank(directory, suffix):
    from cadence.state import PartialState

    with open(
        os.path.join(directory, f"rank{PartialState().process_index}{suffix}"), "w"
    ) as handle:
        handle.write("ok")


def test_debug_launcher_takes_a_functools_partial(tmp_path):
    # The reference's own scheduler tests launch `functools.partial` objects, which have no __name__.
    import functools

    from cadence import debug_launcher

    debug_launcher(functools.partial(_write_rank, str(tmp_path), suffix=".txt"), num_processes=2)
    assert sorted(os.listdir(tmp_path)) == ["rank0.txt", "rank1.txt"]


def test_dynamo_plugin_reads_the_launcher_variables(monkeypatch):
    from cadence.utils import DynamoBackend, TorchDynamoPlugin

    plain = TorchDynamoPlugin()
    assert (plain.backend, plain.mode, plain.fullgraph, plain.dynamic) == (
        DynamoBackend.NO,
        "default",
        False,
        None,  # dynamic stays unset unless the variable is there
    )
    monkeypatch.setenv("ACCELERATE_DYNAMO_BACKEND", "inductor")
    monkeypatch.setenv("ACCELERATE_DYNAMO_MODE", "reduce-overhead")
    monkeypatch.setenv("ACCELERATE_DYNAMO_USE_FULLGRAPH", "yes")
    monkeypatch.setenv("ACCELERATE_DYNAMO_USE_DYNAMIC", "0")
    monkeypatch.setenv("ACCELERATE_DYNAMO_USE_REGIONAL_COMPILATION", "true")
    plugin = TorchDynamoPlugin()
    assert plugin.backend == DynamoBackend.INDUCTOR and plugin.mode == "reduce-overhead"
    assert plugin.fullgraph is True and plugin.dynamic is False
    assert plugin.use_regional_compilation is True
    assert TorchDynamoPlugin(fullgraph=False).fullgraph is False  # an argument wins
    monkeypatch.setenv("ACCELERATE_DYNAMO_USE_FULLGRAPH", "maybe")
    with pytest.raises(ValueError, match="ACCELERATE_DYNAMO_USE_FULLGRAPH"):
        TorchDynamoPlugin()


def _reference_launch_namespace(**overrides):
    """A namespace as a launcher written for the reference fills it: every flag, unused ones at the
    reference parser's defaults."""
    import argparse

    values = dict(
        num_processes=1, num_machines=1, main_process_ip="127.0.0.1", main_process_port=0,
        machine_rank=0, module=False, no_python=False, debug=False, gpu_ids="all",
        mixed_precision="no", dynamo_backend="NO", dynamo_mode="default", use_fsdp=False,
        fsdp_sync_module_states=False, fsdp_version=None, fsdp_min_num_params=0, use_tp=False,
        tp_size=1, use_megatron_lm=False, megatron_lm_tp_degree=1, num_cpu_threads_per_process=1,
        enable_cpu_affinity=False, same_network=False, use_parallelism_config=False,
    )  # fmt: skip
    values.update(overrides)
    return argparse.Namespace(**values)


def test_prepare_multi_gpu_env_plans_the_launch():
    from cadence.core.settings import read_launch_config
    from cadence.utils import prepare_multi_gpu_env

    args = _reference_launch_namespace()
    env = prepare_multi_gpu_env(args)
    # Port 0 on one machine: a free port, as a string of digits (what torchrun is given).
    assert args.master_port.isdigit() and args.master_port != "0"
    assert (args.nproc_per_node, args.nnodes, args.node_rank) == ("1", "1", 0)
    assert env["OMP_NUM_THREADS"] == "1"
    assert read_launch_config(env)["num_processes"] == 1

    args = _reference_launch_namespace(num_processes=2, cpu=True, mixed_precision="bf16")
    record = read_launch_config(prepare_multi_gpu_env(args))
    assert args.nproc_per_node == "2"
    assert (record["num_processes"], record["backend"]) == (2, "gloo")
    assert record["mixed_precision"] == "bf16"


def test_prepare_multi_gpu_env_refuses_what_cadence_launch_refuses():
    from cadence.launch.settings import LaunchPlanError
    from cadence.utils import prepare_multi_gpu_env

    args = _reference_launch_namespace(mixed_precision="fp7")
    with pytest.raises(LaunchPlanError, match="mixed_precision"):
        prepare_multi_gpu_env(args)
    assert "master_port" not in vars(args)  # nothing set on a refused launch


def test_prepare_simple_launcher_cmd_env(tmp_path):
    import sys

    from cadence.utils import prepare_simple_launcher_cmd_env

    script = tmp_path / "train.py"
    script.write_text("print('hi')\n")
    args = _reference_launch_namespace(
        training_script=str(script), training_script_args=["--lr", "1"]
    )
    command, env = prepare_simple_launcher_cmd_env(args)
    assert command == [sys.executable, "-u", str(script), "--lr", "1"]
    assert (env["RANK"], env["WORLD_SIZE"]) == ("0", "1")
