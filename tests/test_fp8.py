"""FP8 training: the recipe handlers, the choice of backend, the refusals before any worker starts, and
torchao's conversion of the linears (which runs on the CPU too, so it is tested here whenever torchao is
installed); the training through the Accelerator needs an fp8 GPU (compute capability 8.9+)."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from harness import free_port

HAS_TORCHAO = importlib.util.find_spec("torchao") is not None
HAS_TE = importlib.util.find_spec("transformer_engine") is not None


def _fp8_gpu() -> bool:
    return torch.cuda.is_available() and torch.cuda.get_device_capability() >= (8, 9)


class Stack(torch.nn.Module):
    """Five linears: 32->64 (first), 64->64, 64->48, 48->10 (not multiples of 16), 10->32 (last)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.first = torch.nn.Linear(32, 64)
        self.middle = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Linear(64, 48))
        self.odd = torch.nn.Linear(48, 10)
        self.last = torch.nn.Linear(10, 32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.first(x))
        h = torch.relu(self.middle(h))
        return self.last(torch.relu(self.odd(h)))


def _ao_policy(handler=None):
    from cadence.precision.choice import choose_precision
    from cadence.precision.fp8 import Float8Precision

    handlers = {} if handler is None else {type(handler).__name__: handler}
    choice = choose_precision("fp8", {}, handlers=handlers)
    return Float8Precision.build_fp8(choice, torch.device("cpu"))


# -- the recipe handlers -----------------------------------------------------------------------------


@pytest.mark.skipif(not HAS_TORCHAO, reason="needs torchao")
def test_ao_recipe_defaults_pad_and_float8_all_gather(monkeypatch):
    from torchao.float8 import Float8LinearConfig

    from cadence.utils import AORecipeKwargs

    default = AORecipeKwargs()
    assert isinstance(default.config, Float8LinearConfig)
    assert default.config.pad_inner_dim and default.config.enable_fsdp_float8_all_gather
    monkeypatch.setenv("ACCELERATE_FP8_PAD_INNER_DIM", "false")
    assert not AORecipeKwargs().config.pad_inner_dim
    mine = Float8LinearConfig(pad_inner_dim=False)
    assert AORecipeKwargs(config=mine).config is mine


@pytest.mark.skipif(HAS_TORCHAO, reason="torchao is installed here")
def test_ao_recipe_without_torchao_names_the_package():
    from cadence.utils import AORecipeKwargs

    with pytest.raises(ImportError, match="pip install torchao"):
        AORecipeKwargs()


@pytest.mark.skipif(HAS_TE, reason="Transformer Engine is installed here")
def test_te_recipe_without_transformer_engine_names_the_package():
    from cadence.utils import TERecipeKwargs

    with pytest.raises(ImportError, match="Transformer Engine"):
        TERecipeKwargs()


def test_msamp_recipe_checks_its_level(monkeypatch):
    from cadence.utils import MSAMPRecipeKwargs

    assert MSAMPRecipeKwargs().opt_level == "O2"
    monkeypatch.setenv("ACCELERATE_FP8_OPT_LEVEL", "O1")
    assert MSAMPRecipeKwargs().opt_level == "O1"
    with pytest.raises(ValueError, match="`opt_level` must be one of O1 or O2"):
        MSAMPRecipeKwargs(opt_level="O3")


# -- the backend and the refusals ----------------------------------------------------------------------


@pytest.mark.skipif(importlib.util.find_spec("msamp") is not None, reason="MS-AMP is installed")
def test_msamp_backend_without_msamp_is_a_clear_error():
    from cadence.precision.choice import check_precision_supported

    with pytest.raises(ImportError, match="MS-AMP"):
        check_precision_supported("fp8", device_type="cuda", fp8_backend="MSAMP")


def test_an_unknown_fp8_backend_names_the_choices(monkeypatch):
    from cadence.precision.choice import resolve_fp8_backend

    monkeypatch.setenv("ACCELERATE_FP8_BACKEND", "bitsandbytes")
    with pytest.raises(ValueError, match="AO, TE, MSAMP"):
        resolve_fp8_backend()


@pytest.mark.skipif(not HAS_TORCHAO, reason="needs torchao")
def test_an_fp8_recipe_without_fp8_precision_is_refused():
    from cadence import Accelerator
    from cadence.utils import AORecipeKwargs

    with pytest.raises(ValueError, match="requires setting `mixed_precision='fp8'`"):
        Accelerator(cpu=True, kwargs_handlers=[AORecipeKwargs()])


@pytest.mark.skipif(not HAS_TORCHAO, reason="needs torchao")
def test_fp8_on_the_cpu_is_refused_before_the_process_state_exists():
    from cadence import Accelerator
    from cadence.state import PartialState

    with pytest.raises(RuntimeError, match="compute capability 8.9"):
        Accelerator(cpu=True, mixed_precision="fp8")
    assert not PartialState._shared_state


@pytest.mark.skipif(torch.cuda.is_available(), reason="about a machine without a GPU")
def test_notebook_launcher_refuses_fp8_without_a_gpu_before_any_worker_starts():
    from cadence import notebook_launcher

    started = []
    error = RuntimeError if (HAS_TORCHAO or HAS_TE) else ImportError
    with pytest.raises(error, match="compute capability 8.9|pip install torchao"):
        notebook_launcher(
            lambda: started.append(1),
            num_processes=2,
            mixed_precision="fp8",
            use_port=str(free_port()),
        )
    assert started == []


# -- torchao's conversion (runs on the CPU) ----------------------------------------------------------


def test_fp8_backend_is_no_without_fp8():
    from cadence import Accelerator

    assert Accelerator(cpu=True).fp8_backend == "NO"


@pytest.mark.skipif(not HAS_TORCHAO, reason="needs torchao")
def test_ao_converts_every_linear_but_the_first_last_and_odd_sized():
    from torchao.float8.float8_linear import Float8Linear

    from cadence.utils import has_ao_layers

    policy = _ao_policy()
    assert policy.fp8_backend == "AO" and policy.scaler is None
    model = policy.convert_model(Stack())
    kinds = {name: type(m).__name__ for name, m in model.named_modules() if name}
    assert kinds["middle.0"] == kinds["middle.1"] == "Float8Linear"
    assert kinds["first"] == kinds["last"] == kinds["odd"] == "Linear"
    assert has_ao_layers(model) and not has_ao_layers(Stack())
    assert policy.convert_model(model) is model  # once only
    assert sum(isinstance(m, Float8Linear) for m in model.modules()) == 2


@pytest.mark.skipif(not HAS_TORCHAO, reason="needs torchao")
def test_ao_recipe_filter_and_config_are_used():
    from torchao.float8 import Float8LinearConfig

    from cadence.utils import AORecipeKwargs

    handler = AORecipeKwargs(
        config=Float8LinearConfig(pad_inner_dim=True),
        module_filter_func=lambda module, fqn: fqn == "first",
    )
    model = _ao_policy(handler).convert_model(Stack())
    converted = [name for name, m in model.named_modules() if type(m).__name__ == "Float8Linear"]
    assert converted == ["first"]
    assert model.first.config.pad_inner_dim


@pytest.mark.skipif(not HAS_TORCHAO, reason="needs torchao")
def test_ao_fp8_steps_follow_bf16_within_fp8_tolerance():
    """Float8 matmuls (dynamic scaling) on the CPU through the policy's forward (bf16 autocast, fp32
    out): the losses of 8 SGD steps stay within fp8's rounding (0.2%) of a bf16 run of the same model."""
    from cadence.precision.policy import AutocastPrecision

    def train(policy):
        model = policy.convert_model(Stack())
        policy.wrap_forward(model)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
        x = torch.randn(16, 32, generator=torch.Generator().manual_seed(3))
        losses = []
        for _ in range(8):  # fit one batch: the loss falls step after step
            output = model(x)
            assert output.dtype == torch.float32
            loss = (output - x).pow(2).mean()
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            losses.append(loss.item())
        return losses

    fp8 = train(_ao_policy())
    bf16 = train(AutocastPrecision("bf16", "cpu"))
    assert fp8[-1] < 0.98 * fp8[0]  # it trains
    assert all(abs(a - b) <= 2e-3 * abs(b) for a, b in zip(fp8, bf16)), (fp8, bf16)


# -- on an fp8 GPU ----------------------------------------------------------------------------------


@pytest.mark.skipif(not (HAS_TORCHAO and _fp8_gpu()), reason="needs torchao and an fp8 GPU (8.9+)")
def test_accelerator_fp8_trains_through_torchao_on_the_gpu():
    from cadence import Accelerator

    def train(mixed_precision):
        from cadence.state import reset_state

        reset_state(destroy_process_group=True)
        acc = Accelerator(mixed_precision=mixed_precision)
        model = Stack()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
        model, optimizer = acc.prepare(model, optimizer)
        generator = torch.Generator().manual_seed(3)
        losses = []
        for _ in range(5):
            x = torch.randn(16, 32, generator=generator).to(acc.device)
            loss = (model(x) - x).pow(2).mean()
            acc.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
            losses.append(loss.item())
        return acc, model, losses

    acc, model, fp8 = train("fp8")
    assert (
        type(model.middle[0]).__name__ == "Float8Linear" and type(model.first).__name__ == "Linear"
    )
    assert acc.ao_recipe_handler is not None and acc.fp8_backend == "AO"
    bf16_acc, _, bf16 = train("bf16")
    assert bf16_acc.fp8_backend == "NO"
    assert all(abs(a - b) <= 0.05 * abs(b) for a, b in zip(fp8, bf16)), (fp8, bf16)


@pytest.mark.skipif(not (HAS_TORCHAO and _fp8_gpu()), reason="needs torchao and an fp8 GPU (8.9+)")
def test_fp8_with_fsdp2_on_one_gpu_shards_float8_linears():
    from torch.distributed.tensor import DTensor

    from cadence import Accelerator, DistributedType
    from cadence.plugins import FullyShardedDataParallelPlugin

    acc = Accelerator(
        mixed_precision="fp8", fsdp_plugin=FullyShardedDataParallelPlugin(fsdp_version=2)
    )
    assert acc.distributed_type == DistributedType.FSDP
    model = Stack()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    model, optimizer = acc.prepare(model, optimizer)
    assert type(model.middle[0]).__name__ == "Float8Linear"
    assert all(isinstance(p, DTensor) for p in model.parameters())
    for _ in range(3):
        x = torch.randn(16, 32, device=acc.device)
        acc.backward((model(x) - x).pow(2).mean())
        optimizer.step()  # the float8 scales are recomputed after this step (all-gather in fp8)
        optimizer.zero_grad()
