"""Several named DeepSpeed plugins (`Accelerator(deepspeed_plugins={...})`) on 2 real gloo processes,
in the two scenarios of the reference's `external_deps/test_ds_multiple_model.py` (which needs
Transformers, GLUE and GPUs, so it cannot run here):

1. one Accelerator, a trained model under ZeRO-2 and a frozen one prepared after
   `state.select_deepspeed_plugin("inference")` under ZeRO-3: each engine takes the plugin selected when
   it was prepared, and `backward()` keeps driving the first engine (the reference's
   `deepspeed_engine_wrapped`);
2. a second `Accelerator()` reusing the state: after selecting "zero3" it prepares its model under ZeRO-3,
   and both models train.

Expected weights come from first principles: DeepSpeed averages the gradients of the two ranks, so each
update is plain SGD on the global batch of 16 samples.

Runs when the `deepspeed` extra is installed."""

from __future__ import annotations

import importlib.util

import pytest
import torch

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("deepspeed") is None, reason="the deepspeed extra is not installed"
)

# Skip DeepSpeed's shared-memory all-reduce op (a minute of C++ compilation on a fresh machine).
ENV = {"CADENCE_DEEPSPEED_SHM_COMM": "0"}
LR = 0.05
NOISE = 0.1
PER_PROCESS_BATCH = 8


def zero2_config() -> dict:
    return {
        "zero_optimization": {"stage": 2},
        "gradient_accumulation_steps": 1,
        "gradient_clipping": 0.0,
        "train_batch_size": "auto",
        "train_micro_batch_size_per_gpu": "auto",
    }


def zero3_config() -> dict:
    return {
        "zero_optimization": {"stage": 3, "stage3_gather_16bit_weights_on_model_save": True},
        "train_micro_batch_size_per_gpu": 1,
        "gradient_clipping": 0.0,  # DeepSpeed's default clips at 1.0: off, for plain SGD updates
    }


class NoiseModel(torch.nn.Module):
    """A frozen model that scales the loss (the reference script's `NoiseModel`)."""

    def __init__(self) -> None:
        super().__init__()
        self.noise_factor = torch.nn.Parameter(torch.tensor([NOISE]))

    def forward(self, loss: torch.Tensor) -> torch.Tensor:
        return (loss * self.noise_factor).sum()


def dataset() -> torch.utils.data.TensorDataset:
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(64, 4, generator=generator)
    y = x @ torch.tensor([[1.0], [-2.0], [0.5], [3.0]])
    return torch.utils.data.TensorDataset(x, y)


def linear(seed: int) -> torch.nn.Linear:
    torch.manual_seed(seed)
    return torch.nn.Linear(4, 1)


def expected_weights(seed: int, loss_factor: float, epochs: int) -> dict[str, torch.Tensor]:
    """One process, plain SGD on the global batches of 2 x 8 samples, the loss scaled by `loss_factor`."""
    model = linear(seed)
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    x, y = dataset().tensors
    for _ in range(epochs):
        for start in range(0, len(x), 2 * PER_PROCESS_BATCH):
            xb, yb = (
                x[start : start + 2 * PER_PROCESS_BATCH],
                y[start : start + 2 * PER_PROCESS_BATCH],
            )
            loss = torch.nn.functional.mse_loss(model(xb), yb) * loss_factor
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
    return {name: value.detach().clone() for name, value in model.state_dict().items()}


def train_with_an_inference_model(epochs: int) -> dict:
    from cadence import Accelerator, DeepSpeedPlugin
    from cadence.utils.deepspeed import get_active_deepspeed_plugin

    zero2 = DeepSpeedPlugin(hf_ds_config=zero2_config())
    zero3 = DeepSpeedPlugin(hf_ds_config=zero3_config())
    acc = Accelerator(deepspeed_plugins={"training": zero2, "inference": zero3})
    assert get_active_deepspeed_plugin(acc.state) is zero2
    model = linear(0)
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    loader = torch.utils.data.DataLoader(dataset(), batch_size=PER_PROCESS_BATCH)
    loader, engine, optimizer = acc.prepare(loader, model, optimizer)
    acc.state.select_deepspeed_plugin("inference")
    assert get_active_deepspeed_plugin(acc.state) is zero3
    inference = acc.prepare(NoiseModel())
    inference.eval()
    acc.state.select_deepspeed_plugin("training")
    for _ in range(epochs):
        for x, y in loader:
            with acc.accumulate(engine):
                loss = torch.nn.functional.mse_loss(engine(x), y)
                with torch.no_grad():
                    noise = inference(loss)
                acc.backward(loss + noise)
                optimizer.step()
                optimizer.zero_grad()
    return {
        "stages": (engine.zero_optimization_stage(), inference.zero_optimization_stage()),
        "backward_drives_the_first_engine": acc.deepspeed_engine_wrapped.engine is engine,
        "weights": acc.get_state_dict(engine),
        "inference_weights": acc.get_state_dict(inference),  # gathered on the main process
    }


def test_each_engine_takes_the_plugin_selected_and_backward_drives_the_first(dist_pool):
    results = dist_pool(2).run(train_with_an_inference_model, 2, env=ENV, timeout=240)
    expected = expected_weights(0, 1.0, epochs=2)  # the noise is computed without grad: a constant
    for result in results:
        assert result["stages"] == (2, 3)
        assert result["backward_drives_the_first_engine"]
    # The frozen model never steps.
    assert torch.equal(results[0]["inference_weights"]["noise_factor"], torch.tensor([NOISE]))
    weights = results[0]["weights"]  # gathered on the main process
    for name, value in expected.items():
        torch.testing.assert_close(weights[name], value, rtol=1e-5, atol=1e-6)


def train_two_accelerators(epochs: int) -> dict:
    from cadence import Accelerator, DeepSpeedPlugin
    from cadence.utils.deepspeed import get_active_deepspeed_plugin

    zero2 = DeepSpeedPlugin(hf_ds_config=zero2_config())
    zero3 = DeepSpeedPlugin(hf_ds_config=zero3_config())
    zero2_acc = Accelerator(deepspeed_plugins={"zero2": zero2, "zero3": zero3})
    zero3_acc = Accelerator()  # reuses the state, with its plugins
    loader = torch.utils.data.DataLoader(dataset(), batch_size=PER_PROCESS_BATCH)
    model_a = linear(0)
    optimizer_a = torch.optim.SGD(model_a.parameters(), lr=LR)
    loader, engine_a, optimizer_a = zero2_acc.prepare(loader, model_a, optimizer_a)
    zero3_acc.state.select_deepspeed_plugin("zero3")
    assert get_active_deepspeed_plugin(zero3_acc.state) is zero3
    zero3.deepspeed_config["train_micro_batch_size_per_gpu"] = PER_PROCESS_BATCH
    model_b = linear(1)
    optimizer_b = torch.optim.SGD(model_b.parameters(), lr=LR)
    engine_b, optimizer_b = zero3_acc.prepare(model_b, optimizer_b)
    for _ in range(epochs):
        for x, y in loader:
            with zero2_acc.accumulate(engine_a, engine_b):
                zero2_acc.backward(torch.nn.functional.mse_loss(engine_a(x), y))
                optimizer_a.step()
                optimizer_a.zero_grad()
                zero3_acc.backward(torch.nn.functional.mse_loss(engine_b(x), y))
                optimizer_b.step()
                optimizer_b.zero_grad()
    return {
        "stages": (engine_a.zero_optimization_stage(), engine_b.zero_optimization_stage()),
        "engines": (
            zero2_acc.deepspeed_engine_wrapped.engine is engine_a,
            zero3_acc.deepspeed_engine_wrapped.engine is engine_b,
        ),
        "weights": (zero2_acc.get_state_dict(engine_a), zero3_acc.get_state_dict(engine_b)),
    }


def test_a_second_accelerator_prepares_under_the_plugin_selected(dist_pool):
    results = dist_pool(2).run(train_two_accelerators, 2, env=ENV, timeout=240)
    for result in results:
        assert result["stages"] == (2, 3)
        assert result["engines"] == (True, True)
    for seed, weights in zip((0, 1), results[0]["weights"]):
        for name, value in expected_weights(seed, 1.0, epochs=2).items():
            torch.testing.assert_close(weights[name], value, rtol=1e-5, atol=1e-6)
