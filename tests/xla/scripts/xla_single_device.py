"""One XLA device (torch_xla's CPU device, PJRT_DEVICE=CPU): detection, training against eager CPU,
collectives, RNG, checkpoints, bf16 and the refused combinations. Prints one JSON report."""

from __future__ import annotations

import os
import sys
import tempfile

import torch

sys.path.insert(0, os.path.dirname(__file__))
from xla_common import (  # noqa: E402
    ACCUMULATION,
    BATCH,
    CLIP,
    LR,
    dataset,
    eager_cpu_training,
    fresh_model,
    max_diff,
    report,
)

import cadence  # noqa: E402
from cadence import Accelerator  # noqa: E402
from cadence.state import reset_state  # noqa: E402
from cadence.utils import set_seed, synchronize_rng_states  # noqa: E402

results: dict = {"torch_xla_loaded_by_import_cadence": "torch_xla" in sys.modules}


def train(accelerator: Accelerator, model, optimizer, loader):
    losses = []
    for x, y in loader:
        with accelerator.accumulate(model):
            loss = torch.nn.functional.mse_loss(model(x), y)
            losses.append(loss)
            accelerator.backward(loss)
            if accelerator.sync_gradients:
                accelerator.clip_grad_norm_(model.parameters(), CLIP)
            optimizer.step()
            optimizer.zero_grad()
    return [float(loss.item()) for loss in losses]


# -- detection and training -----------------------------------------------------------------------
accelerator = Accelerator(gradient_accumulation_steps=ACCUMULATION)
results["distributed_type"] = str(accelerator.distributed_type.value)
results["device_type"] = accelerator.device.type
results["num_processes"] = accelerator.num_processes
results["process_index"] = accelerator.process_index
results["local_process_index"] = accelerator.local_process_index
results["is_main_process"] = accelerator.is_main_process
results["strategy"] = type(accelerator._strategy).__name__
model = fresh_model()
optimizer = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)  # built before the move
loader = torch.utils.data.DataLoader(dataset(), batch_size=BATCH)
model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
results["tied_after_prepare"] = model.decode.weight is model.encode.weight
results["param_device"] = model.encode.weight.device.type
results["optimizer_params_are_model_params"] = all(
    any(p is q for q in model.parameters())
    for group in optimizer.param_groups
    for p in group["params"]
)
first_batch = next(iter(loader))
results["batch_device"] = first_batch[0].device.type
xla_losses = train(accelerator, model, optimizer, loader)
expected, cpu_losses = eager_cpu_training()
trained = accelerator.get_state_dict(model)
results["state_dict_devices"] = sorted({v.device.type for v in trained.values()})
results["weights_max_abs_diff"] = max_diff(trained, expected)
results["loss_max_abs_diff"] = max(abs(a - b) for a, b in zip(xla_losses, cpu_losses))
results["losses_xla"] = xla_losses
results["losses_cpu"] = cpu_losses
results["unwrap_is_model"] = accelerator.unwrap_model(model) is model

# -- collectives on one device ----------------------------------------------------------------------
device = accelerator.device
t = torch.arange(4.0, device=device)
results["gather"] = accelerator.gather(t).cpu().tolist()
results["gather_device"] = accelerator.gather(t).device.type
results["reduce_sum"] = accelerator.reduce(t, "sum").cpu().tolist()
results["reduce_sum_scale"] = accelerator.reduce(t, "sum", scale=2.0).cpu().tolist()
results["reduce_mean_scale"] = cadence.utils.reduce(t, "mean", scale=0.5).cpu().tolist()
results["broadcast"] = cadence.utils.broadcast(t.clone()).cpu().tolist()
results["gather_object"] = cadence.utils.gather_object([{"rank": accelerator.process_index}])
results["pad"] = accelerator.pad_across_processes(t[None], dim=1).cpu().tolist()
results["broadcast_object_list"] = cadence.utils.broadcast_object_list(["a", 1])
accelerator.wait_for_everyone()

# -- RNG -------------------------------------------------------------------------------------------
import torch_xla.core.xla_model as xm  # noqa: E402

set_seed(1234)
results["xla_seed_after_set_seed"] = int(xm.get_rng_state())
synchronize_rng_states(["xla", "torch"])
draw_a = torch.rand(3, device=device).cpu()
set_seed(1234)
draw_b = torch.rand(3, device=device).cpu()
results["xla_draws_repeat_after_set_seed"] = bool(torch.equal(draw_a, draw_b))

# -- checkpoints -----------------------------------------------------------------------------------
with tempfile.TemporaryDirectory() as folder:
    set_seed(77)
    saved = accelerator.save_state(os.path.join(folder, "ckpt"))
    weights_at_save = accelerator.get_state_dict(model)
    momentum_at_save = {
        k: v["momentum_buffer"].cpu().clone() for k, v in enumerate(optimizer.state.values())
    }
    seed_at_save = int(xm.get_rng_state())
    draw_after_save = torch.rand(3, device=device).cpu()
    train(accelerator, model, optimizer, loader)  # moves away from the saved state
    results["weights_moved_after_save"] = max_diff(
        accelerator.get_state_dict(model), weights_at_save
    )
    accelerator.load_state(saved)
    results["load_state_weights_diff"] = max_diff(
        accelerator.get_state_dict(model), weights_at_save
    )
    results["load_state_param_device"] = model.encode.weight.device.type
    results["load_state_tied"] = model.decode.weight is model.encode.weight
    results["load_state_momentum_diff"] = max(
        float((v["momentum_buffer"].cpu() - momentum_at_save[k]).abs().max())
        for k, v in enumerate(optimizer.state.values())
    )
    results["load_state_momentum_device"] = sorted(
        {v["momentum_buffer"].device.type for v in optimizer.state.values()}
    )
    results["load_state_xla_seed"] = int(xm.get_rng_state()) == seed_at_save
    results["load_state_xla_draw_repeats"] = bool(
        torch.equal(torch.rand(3, device=device).cpu(), draw_after_save)
    )
    results["checkpoint_files"] = sorted(os.listdir(saved))
    # Accelerator.save: CPU tensors in the file (pickle and safetensors), as the reference's xm.save
    from safetensors.torch import load_file

    saved_devices = {}
    for safe in (False, True):
        path = os.path.join(folder, f"weights_{safe}")
        accelerator.save(
            accelerator.unwrap_model(model).state_dict(), path, safe_serialization=safe
        )
        back = load_file(path) if safe else torch.load(path, weights_only=True)
        saved_devices[str(safe)] = sorted({v.device.type for v in back.values()})
        results[f"save_safe_{safe}_diff"] = max(
            float((back[k] - weights_at_save[k]).abs().max()) for k in back
        )
    results["save_devices"] = saved_devices
    # save_model: safetensors on the CPU, the same values
    accelerator.save_model(model, os.path.join(folder, "model"))

    files = sorted(os.listdir(os.path.join(folder, "model")))
    results["save_model_files"] = files
    loaded = load_file(os.path.join(folder, "model", "model.safetensors"))
    results["save_model_diff"] = max(
        float((loaded[k] - weights_at_save[k]).abs().max()) for k in loaded
    )
    results["save_model_keys_cover_model"] = all(
        k in loaded or k == "decode.weight" for k in weights_at_save
    )

# -- a mid-epoch dataloader position round-trips -----------------------------------------------------
with tempfile.TemporaryDirectory() as folder:
    iterator = iter(loader)
    next(iterator)
    next(iterator)
    saved = accelerator.save_state(os.path.join(folder, "mid"))
    expected_next = next(iterator)[0].cpu()
    del iterator
    accelerator.load_state(saved)
    results["resumed_batch_matches"] = bool(torch.equal(next(iter(loader))[0].cpu(), expected_next))

# -- bf16 through torch.autocast("xla") ---------------------------------------------------------------
reset_state()
accelerator = Accelerator(mixed_precision="bf16")
results["bf16_mixed_precision"] = accelerator.mixed_precision
model = fresh_model()
optimizer = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)
loader = torch.utils.data.DataLoader(dataset(), batch_size=BATCH)
model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
inner_dtypes = []
handle = model.encode.register_forward_hook(lambda m, i, o: inner_dtypes.append(o.dtype))
x, y = next(iter(loader))
out = model(x)
handle.remove()
results["bf16_inner_dtype"] = str(inner_dtypes[0])
results["bf16_output_dtype"] = str(out.dtype)
bf16_losses = train(accelerator, model, optimizer, loader)
_, bf16_cpu_losses = eager_cpu_training(accumulation=1, autocast_bf16=True)
results["bf16_loss_max_abs_diff"] = max(abs(a - b) for a, b in zip(bf16_losses, bf16_cpu_losses))
results["bf16_losses_finite"] = all(loss == loss for loss in bf16_losses)

# -- CADENCE_XLA_MP_DEVICE_LOADER=1: the reference's MpDeviceLoader thread instead of the in-order transfer
reset_state()
os.environ["CADENCE_XLA_MP_DEVICE_LOADER"] = "1"
accelerator = Accelerator()
model = fresh_model()
optimizer = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)
loader = torch.utils.data.DataLoader(dataset(), batch_size=BATCH)
model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
del os.environ["CADENCE_XLA_MP_DEVICE_LOADER"]
results["mp_loader_type"] = type(loader).__name__
results["mp_loader_len"] = len(loader)
results["mp_loader_batch_device"] = next(iter(loader))[0].device.type
mp_losses = train(accelerator, model, optimizer, loader)
_, plain_cpu_losses = eager_cpu_training(accumulation=1)
results["mp_loader_loss_max_abs_diff"] = max(
    abs(a - b) for a, b in zip(mp_losses, plain_cpu_losses)
)
results["mp_loader_steps"] = len(mp_losses)

# -- explicit settings win, bad combinations fail before any side effect ------------------------------
reset_state()
accelerator = Accelerator(cpu=True)
results["cpu_true_distributed_type"] = str(accelerator.distributed_type.value)
results["cpu_true_device"] = accelerator.device.type
reset_state()
errors = {}
for name, kwargs in {
    "fp16": {"mixed_precision": "fp16"},
    "fp8": {"mixed_precision": "fp8"},
}.items():
    try:
        Accelerator(**kwargs)
        errors[name] = None
    except (ValueError, ImportError, RuntimeError) as error:
        errors[name] = f"{type(error).__name__}: {error}"
    reset_state()
try:
    from cadence.utils import DeepSpeedPlugin

    Accelerator(deepspeed_plugin=DeepSpeedPlugin(zero_stage=2))
    errors["deepspeed"] = None
except (ValueError, ImportError) as error:
    errors["deepspeed"] = f"{type(error).__name__}: {error}"
results["errors"] = errors
from cadence.state import PartialState  # noqa: E402

results["state_after_errors_initialized"] = PartialState._shared_state != {}
report(results)
