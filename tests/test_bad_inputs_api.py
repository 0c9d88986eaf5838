"""Bad inputs to the Python API fail with a clear message, before any side effect (one process).

Table-driven: each bad input -> the exception type and a phrase of its message. Then the "nothing
happened" checks (no process state, no process group, no folder, nothing prepared), a subprocess that
looks like rank 1 of a two-process job (the error must name the rank and no process group may be
created), and a hypothesis fuzzer over Accelerator(...) argument combinations.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
import traceback
import warnings
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from torch.utils.data import DataLoader, TensorDataset

import cadence
from cadence import Accelerator
from cadence.data import prepare_data_loader
from cadence.runtime.collectives import (
    broadcast,
    broadcast_object_list,
    concatenate,
    gather,
    pad_across_processes,
    reduce,
)
from cadence.state import PartialState, reset_state
from cadence.utils import (
    DataLoaderConfiguration,
    DistributedDataParallelKwargs,
    GradientAccumulationPlugin,
    GradScalerKwargs,
    InitProcessGroupKwargs,
    ProjectConfiguration,
    TorchDynamoPlugin,
)

CADENCE_SOURCE = Path(cadence.__file__).parent
INPUT_ERRORS = (TypeError, ValueError, NotImplementedError, ImportError)
# Bounded for CI; raise it to fuzz harder locally (e.g. CADENCE_FUZZ_EXAMPLES=5000).
FUZZ_EXAMPLES = int(os.environ.get("CADENCE_FUZZ_EXAMPLES", "80"))


@pytest.fixture(autouse=True)
def fresh_state():
    reset_state()
    yield
    reset_state()


def model() -> torch.nn.Module:
    return torch.nn.Linear(2, 2)


def dataset(n: int = 12) -> TensorDataset:
    return TensorDataset(torch.arange(float(n)))


class NoBatchSizeSampler:
    """A batch sampler without a `batch_size` attribute."""

    def __iter__(self):
        return iter([[0, 1], [2, 3]])

    def __len__(self) -> int:
        return 2


def assert_untouched_process() -> None:
    """No process state was created and no process group started."""
    assert PartialState._shared_state == {}
    assert not (dist.is_available() and dist.is_initialized())


# -- Accelerator(...) ---------------------------------------------------------------------------
CONSTRUCTOR_CASES = {
    "unknown mixed precision": (dict(mixed_precision="fp32"), ValueError, "mixed_precision"),
    "zero accumulation steps": (
        dict(gradient_accumulation_steps=0),
        ValueError,
        "positive integer",
    ),
    "steps and plugin": (
        dict(
            gradient_accumulation_steps=2,
            gradient_accumulation_plugin=GradientAccumulationPlugin(num_steps=2),
        ),
        ValueError,
        "not both",
    ),
    "plugin as dict": (
        dict(gradient_accumulation_plugin={"num_steps": 2}),
        TypeError,
        "GradientAccumulationPlugin",
    ),
    "unknown rng type": (dict(rng_types=["numpy"]), ValueError, "rng_types"),
    "rng types not a list": (dict(rng_types=5), TypeError, "list of names"),
    "one handler, not a list": (
        dict(kwargs_handlers=DistributedDataParallelKwargs()),
        TypeError,
        "kwargs_handlers=[DistributedDataParallelKwargs",
    ),
    "same handler twice": (
        dict(kwargs_handlers=[DistributedDataParallelKwargs(), DistributedDataParallelKwargs()]),
        ValueError,
        "only pass one",
    ),
    "handler class, not object": (
        dict(kwargs_handlers=[GradScalerKwargs]),
        TypeError,
        "KwargsHandler",
    ),
    "unknown process group backend": (
        dict(kwargs_handlers=[InitProcessGroupKwargs(backend="mpi2")]),
        ValueError,
        "not a torch.distributed backend",
    ),
    "dataloader config as dict": (
        dict(dataloader_config={"split_batches": True}),
        TypeError,
        "DataLoaderConfiguration",
    ),
    "split_batches next to dataloader_config": (
        dict(dataloader_config=DataLoaderConfiguration(), split_batches=True),
        ValueError,
        "inside dataloader_config",
    ),
    "project config as dict": (
        dict(project_config={"project_dir": "x"}),
        TypeError,
        "ProjectConfiguration",
    ),
    "project dir not a path": (dict(project_dir=5), TypeError, "must be a path"),
    "two project dirs": (
        dict(project_dir="a", project_config=ProjectConfiguration(project_dir="b")),
        ValueError,
        "conflicts",
    ),
    "unknown dynamo backend": (dict(dynamo_backend="warp"), ValueError, "dynamo_backend"),
    "dynamo backend and plugin": (
        dict(dynamo_backend="eager", dynamo_plugin=TorchDynamoPlugin(backend="eager")),
        ValueError,
        "not both",
    ),
    "unknown tracker": (dict(log_with="nope"), ValueError, "Unsupported logging capability"),
    "unknown keyword": (dict(fp16=True), TypeError, "unexpected keyword"),
    "cpu as text": (dict(cpu="false"), TypeError, "True or False"),
    "device placement as text": (dict(device_placement="no"), TypeError, "True or False"),
    "fsdp plugin as text": (dict(fsdp_plugin="yes"), TypeError, "FullyShardedDataParallelPlugin"),
    "megatron": (dict(megatron_lm_plugin=object()), NotImplementedError, "Megatron"),
}


@pytest.mark.parametrize("case", list(CONSTRUCTOR_CASES))
def test_accelerator_refuses_bad_arguments_before_starting_anything(case):
    kwargs, error, phrase = CONSTRUCTOR_CASES[case]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        with pytest.raises(error, match=re.escape(phrase)):
            Accelerator(**kwargs)
    assert_untouched_process()


CONFIG_CLASS_CASES = {
    "accumulation steps zero": (
        lambda: GradientAccumulationPlugin(num_steps=0),
        ValueError,
        "positive integer",
    ),
    "timeout as text": (
        lambda: InitProcessGroupKwargs(timeout="soon"),
        ValueError,
        "number of seconds",
    ),
    "negative timeout": (lambda: InitProcessGroupKwargs(timeout=-5), ValueError, "positive"),
    "unknown ddp hook": (
        lambda: DistributedDataParallelKwargs(comm_hook="zip"),
        ValueError,
        "power_sgd",
    ),
    "split_batches as text": (
        lambda: DataLoaderConfiguration(split_batches="yes"),
        TypeError,
        "True or False",
    ),
    "data seed as text": (lambda: DataLoaderConfiguration(data_seed="42"), TypeError, "data_seed"),
    "project dir as number": (
        lambda: ProjectConfiguration(project_dir=3),
        TypeError,
        "must be a path",
    ),
    "unknown dynamo backend": (lambda: TorchDynamoPlugin(backend="warp"), ValueError, "INDUCTOR"),
}


@pytest.mark.parametrize("case", list(CONFIG_CLASS_CASES))
def test_configuration_objects_check_their_fields(case):
    build, error, phrase = CONFIG_CLASS_CASES[case]
    with pytest.raises(error, match=re.escape(phrase)):
        build()


@pytest.mark.skipif(
    any(importlib.util.find_spec(name) for name in ("torchao", "transformer_engine")),
    reason="an FP8 package is installed here",
)
def test_fp8_without_a_backend_fails_before_the_process_state_exists():
    with pytest.raises(ImportError, match="pip install torchao"):
        Accelerator(mixed_precision="fp8")
    assert_untouched_process()


def test_a_failed_constructor_creates_no_folder(tmp_path):
    project = tmp_path / "project"
    with pytest.raises(ValueError, match="mixed_precision"):
        Accelerator(project_dir=project, log_with="tensorboard", mixed_precision="fp64")
    assert not project.exists()
    assert_untouched_process()


# -- prepare() and the prepare_* methods -----------------------------------------------------
def _optimizer_of(m: torch.nn.Module) -> torch.optim.Optimizer:
    return torch.optim.SGD(m.parameters(), lr=0.1)


PREPARE_CASES = {
    "a class": (lambda acc: acc.prepare(torch.nn.Linear), TypeError, "class Linear"),
    "a list of objects": (
        lambda acc: acc.prepare([model()]),
        TypeError,
        "does not look inside containers",
    ),
    "a dict of objects": (
        lambda acc: acc.prepare({"m": model()}),
        TypeError,
        "does not look inside containers",
    ),
    "a dataset": (lambda acc: acc.prepare(dataset()), TypeError, "DataLoader(dataset"),
    "parameters": (
        lambda acc: acc.prepare(model().parameters()),
        TypeError,
        "pass the model itself",
    ),
    "placements of wrong length": (
        lambda acc: acc.prepare(model(), device_placement=[True, False]),
        ValueError,
        "one bool per object",
    ),
    "placement as text": (
        lambda acc: acc.prepare(model(), device_placement=["no"]),
        TypeError,
        "True, False or None",
    ),
    "prepare_model of text": (lambda acc: acc.prepare_model("model"), TypeError, "torch.nn.Module"),
    "prepare_optimizer of a model": (
        lambda acc: acc.prepare_optimizer(model()),
        TypeError,
        "torch.optim.Optimizer",
    ),
    "prepare_scheduler of an optimizer": (
        lambda acc: acc.prepare_scheduler(_optimizer_of(model())),
        TypeError,
        "prepare_optimizer",
    ),
    "prepare_scheduler of text": (
        lambda acc: acc.prepare_scheduler("cosine"),
        TypeError,
        "learning-rate scheduler",
    ),
    "prepare_data_loader of a dataset": (
        lambda acc: acc.prepare_data_loader(dataset()),
        TypeError,
        "torch.utils.data.DataLoader",
    ),
    "backward of a number": (lambda acc: acc.backward(1.5), TypeError, "loss tensor"),
    "zero accumulation steps later": (
        lambda acc: setattr(acc, "gradient_accumulation_steps", 0),
        ValueError,
        "positive integer",
    ),
    "negative barrier timeout": (
        lambda acc: acc.wait_for_everyone(timeout=-1),
        ValueError,
        "positive number of seconds",
    ),
    "skip batches of text": (
        lambda acc: acc.skip_first_batches("loader", 1),
        TypeError,
        "DataLoader",
    ),
    "skip a negative count": (
        lambda acc: acc.skip_first_batches(DataLoader(dataset()), -1),
        ValueError,
        "non-negative",
    ),
}


@pytest.mark.parametrize("case", list(PREPARE_CASES))
def test_prepare_refuses_wrong_objects(case):
    call, error, phrase = PREPARE_CASES[case]
    accelerator = Accelerator(cpu=True)
    with pytest.raises(error, match=re.escape(phrase)):
        call(accelerator)


def test_a_bad_argument_leaves_the_other_arguments_unprepared():
    accelerator = Accelerator(cpu=True)
    net = model()
    optimizer = _optimizer_of(net)
    with pytest.raises(TypeError, match="dataset"):
        accelerator.prepare(net, optimizer, dataset())
    assert accelerator._models == [] and accelerator._optimizers == []
    # The same call without the mistake works, so nothing half-prepared is left behind.
    prepared_model, prepared_optimizer = accelerator.prepare(net, optimizer)
    assert accelerator.unwrap_model(prepared_model) is net
    assert prepared_optimizer.optimizer is optimizer


def test_objects_prepare_does_not_know_still_pass_through():
    accelerator = Accelerator(cpu=True)
    marker = object()
    assert accelerator.prepare(None) is None
    assert accelerator.prepare(marker) is marker
    assert accelerator.prepare([1, 2]) == [1, 2]  # a container of plain values is not a mistake


# -- collectives on one process -------------------------------------------------------------------
OPS_CASES = {
    "gather of text": (lambda: gather("x"), TypeError, "gather_object"),
    "gather of nested text": (
        lambda: gather({"a": [torch.ones(1), "b"]}),
        TypeError,
        "Unsupported types (<class 'str'>)",
    ),
    "unknown reduction": (lambda: reduce(torch.ones(2), reduction="avg"), ValueError, "'mean'"),
    "reduce of text": (lambda: reduce("x"), TypeError, "Unsupported types (<class 'str'>)"),
    "pad dimension as text": (
        lambda: pad_across_processes(torch.ones(2), dim="0"),
        TypeError,
        "integer",
    ),
    "pad of a number": (
        lambda: pad_across_processes(3),
        TypeError,
        "Unsupported types (<class 'int'>)",
    ),
    "broadcast of text": (lambda: broadcast_object_list("abc"), TypeError, "needs a list"),
    "concatenate nothing": (lambda: concatenate([]), TypeError, "non-empty list"),
}


@pytest.mark.parametrize("case", list(OPS_CASES))
def test_collectives_refuse_bad_inputs(case):
    call, error, phrase = OPS_CASES[case]
    with pytest.raises(error, match=re.escape(phrase)):
        call()


def test_broadcast_on_one_process_returns_its_input():
    tensor = torch.arange(3)
    assert broadcast(tensor) is tensor


# -- dataloader configurations ----------------------------------------------------------------
DATALOADER_CASES = {
    "split batch not divisible": (
        lambda: prepare_data_loader(
            DataLoader(dataset(), batch_size=3),
            num_processes=2,
            process_index=0,
            split_batches=True,
        ),
        ValueError,
        "batch size (3) that is a round multiple of the number of processes (2)",
    ),
    "split without a batch size": (
        lambda: prepare_data_loader(
            DataLoader(dataset(), batch_sampler=NoBatchSizeSampler()),
            num_processes=2,
            process_index=0,
            split_batches=True,
        ),
        ValueError,
        "batch_size=None",
    ),
    "dispatch without device placement": (
        lambda: prepare_data_loader(
            DataLoader(dataset()), dispatch_batches=True, put_on_device=False
        ),
        ValueError,
        "put_on_device=True",
    ),
    "rank outside the world": (
        lambda: prepare_data_loader(DataLoader(dataset()), num_processes=2, process_index=2),
        ValueError,
        "process_index in [0, num_processes)",
    ),
    "empty world": (
        lambda: prepare_data_loader(DataLoader(dataset()), num_processes=0, process_index=0),
        ValueError,
        "at least 1",
    ),
    "unknown rng type": (
        lambda: prepare_data_loader(DataLoader(dataset(), shuffle=True), rng_types=["numpy"]),
        ValueError,
        "rng_types",
    ),
    "data seed as text": (
        lambda: prepare_data_loader(
            DataLoader(dataset(), shuffle=True), use_seedable_sampler=True, data_seed="7"
        ),
        TypeError,
        "data_seed",
    ),
}


@pytest.mark.parametrize("case", list(DATALOADER_CASES))
def test_impossible_dataloader_configurations(case):
    call, error, phrase = DATALOADER_CASES[case]
    with pytest.raises(error, match=re.escape(phrase)):
        call()


# -- rank named, nothing started (a process that believes it is rank 1 of 2) --------------------
RANK_ONE_SCRIPT = r"""
import json, sys, torch.distributed as dist
from cadence import Accelerator
from cadence.state import PartialState
from cadence.utils import InitProcessGroupKwargs
results = {}
for name, kwargs in {
    "steps": dict(gradient_accumulation_steps=0),
    "backend": dict(kwargs_handlers=[InitProcessGroupKwargs(backend="carrier-pigeon")]),
    "precision": dict(mixed_precision="fp64"),
}.items():
    try:
        Accelerator(**kwargs)
        results[name] = "no error"
    except Exception as error:
        results[name] = f"{type(error).__name__}: {error}"
results["process_group"] = dist.is_initialized()
results["state"] = bool(PartialState._shared_state)
print(json.dumps(results))
"""


def test_errors_name_the_rank_and_no_process_group_is_created(tmp_path):
    from harness import free_port

    env = {
        **os.environ,
        "RANK": "1",
        "LOCAL_RANK": "1",
        "WORLD_SIZE": "2",
        "LOCAL_WORLD_SIZE": "2",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(free_port()),  # nobody listens: reaching the rendezvous would hang
        "OMP_NUM_THREADS": "1",
        "CUDA_VISIBLE_DEVICES": "",  # a CPU rank of a 2-process job, also on a GPU machine
    }
    done = subprocess.run(
        [sys.executable, "-c", RANK_ONE_SCRIPT],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    results = json.loads(done.stdout.strip().splitlines()[-1])
    assert results["steps"].startswith("ValueError: [rank 1] gradient_accumulation_steps")
    assert (
        results["backend"].startswith("ValueError: [rank 1]")
        and "carrier-pigeon" in results["backend"]
    )
    assert (
        results["precision"].startswith("ValueError: [rank 1]") and "fp64" in results["precision"]
    )
    assert results["process_group"] is False and results["state"] is False


# -- fuzzing the constructor ----------------------------------------------------------------------
def _choices(*factories):
    """A strategy drawing one factory and calling it, so every example gets fresh objects."""
    return st.sampled_from(factories).map(lambda make: make())


CONSTRUCTOR_ARGUMENTS = {
    "mixed_precision": _choices(
        lambda: "fp8",
        lambda: None,
        lambda: "no",
        lambda: "bf16",
        lambda: "FP16",
        lambda: "fp32",
        lambda: 16,
    ),
    "gradient_accumulation_steps": _choices(
        lambda: 1, lambda: 3, lambda: 0, lambda: -2, lambda: "2", lambda: 2.0, lambda: True
    ),
    "cpu": _choices(lambda: True, lambda: False, lambda: None, lambda: "false", lambda: 1),
    "device_placement": _choices(lambda: True, lambda: False, lambda: "yes"),
    "split_batches": _choices(lambda: True, lambda: False, lambda: "no"),
    "rng_types": _choices(
        lambda: None,
        lambda: ["torch"],
        lambda: ["generator", "torch"],
        lambda: "torch",
        lambda: [],
        lambda: ["numpy"],
        lambda: 3,
    ),
    "kwargs_handlers": _choices(
        lambda: None,
        lambda: [],
        lambda: [DistributedDataParallelKwargs(find_unused_parameters=True)],
        lambda: DistributedDataParallelKwargs(),
        lambda: [GradScalerKwargs(), GradScalerKwargs()],
        lambda: ["ddp"],
        lambda: [InitProcessGroupKwargs(backend="gloo")],
        lambda: [InitProcessGroupKwargs(backend="mpi2")],
        lambda: {"ddp": DistributedDataParallelKwargs()},
    ),
    "dataloader_config": _choices(
        lambda: None,
        lambda: DataLoaderConfiguration(),
        lambda: DataLoaderConfiguration(split_batches=True, even_batches=False),
        lambda: {"split_batches": True},
        lambda: "default",
    ),
    "project_config": _choices(
        lambda: None,
        lambda: ProjectConfiguration(),
        lambda: ProjectConfiguration(project_dir="elsewhere"),
        lambda: {},
    ),
    "project_dir": _choices(
        lambda: None, lambda: "fuzz-project", lambda: Path("fuzz-project"), lambda: 7, lambda: ["a"]
    ),
    "gradient_accumulation_plugin": _choices(
        lambda: None, lambda: GradientAccumulationPlugin(num_steps=2), lambda: {"num_steps": 2}
    ),
    "step_scheduler_with_optimizer": _choices(lambda: True, lambda: False, lambda: "false"),
    "dynamo_backend": _choices(
        lambda: None, lambda: "no", lambda: "eager", lambda: "EAGER", lambda: "warp", lambda: 1
    ),
    "log_with": _choices(lambda: None, lambda: "nope", lambda: 5, lambda: [], lambda: [None]),
    "fsdp_plugin": _choices(lambda: None, lambda: "fsdp", lambda: 1),
    "megatron_lm_plugin": _choices(lambda: None, lambda: object()),
    "even_batches": _choices(
        lambda: True, lambda: False
    ),  # an older spelling, with a FutureWarning
    "no_such_option": _choices(lambda: 1),
}


@settings(
    max_examples=FUZZ_EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(
    arguments=st.dictionaries(
        st.sampled_from(sorted(CONSTRUCTOR_ARGUMENTS)), st.none(), max_size=6
    ).flatmap(
        lambda chosen: st.fixed_dictionaries({name: CONSTRUCTOR_ARGUMENTS[name] for name in chosen})
    )
)
def test_fuzz_accelerator_arguments(arguments, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # relative project dirs land here (and must not be created)
    reset_state()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            accelerator = Accelerator(**arguments)
    except INPUT_ERRORS as error:
        event(f"refused: {type(error).__name__}")
        message = str(error)
        assert len(message) > 25, f"unclear message for {arguments!r}: {message!r}"
        raised_in = Path(traceback.extract_tb(error.__traceback__)[-1].filename).resolve()
        assert CADENCE_SOURCE in raised_in.parents, (
            f"{type(error).__name__} for {arguments!r} came from {raised_in}, not from a Cadence check: "
            f"{message}"
        )
        assert_untouched_process()
        assert not (tmp_path / "fuzz-project").exists()
        return
    event("accepted")
    try:  # accepted: the settings that came out are sane
        assert isinstance(accelerator.gradient_accumulation_steps, int)
        assert accelerator.gradient_accumulation_steps >= 1
        assert accelerator.mixed_precision in ("no", "fp16", "bf16", "fp8")
        assert isinstance(accelerator.split_batches, bool)
        assert not (tmp_path / "fuzz-project").exists()
    finally:
        reset_state()
