"""What the Accelerator does with a model dispatched over devices: refuse to train it in distributed
mode, and save its full weights (offloaded ones included)."""

from __future__ import annotations

from typing import Any, Optional

import torch
from torch import nn

from ..core.settings import env_text
from .tensors import get_state_dict_offloaded_model, has_offloaded_params

DEVICE_MAP_TRAINING_ERROR = (
    "You can't train a model that has been loaded with `device_map='auto'` in any distributed mode."
    " Please rerun your script specifying `--num_processes=1` or by launching with `python {{myscript.py}}`."
)


def verify_device_map(model: nn.Module) -> bool:
    """True when `model` (or a submodule) was dispatched with a device map of more than one entry.

    Example:
        >>> verify_device_map(dispatch_model(model, {"0": "cpu", "1": "disk"}, offload_dir="offload"))
        True
    """
    return any(len(getattr(m, "hf_device_map", None) or {}) > 1 for m in model.modules())


def check_model_is_trainable(model: nn.Module, distributed_type: Any) -> None:
    """Raise Accelerate's ValueError when a dispatched model is prepared in a distributed mode
    (`distributed_type` is anything but "NO"); ACCELERATE_BYPASS_DEVICE_MAP=true skips the check."""
    name = getattr(distributed_type, "value", distributed_type)
    if str(name).upper() == "NO":
        return
    if env_text("ACCELERATE_BYPASS_DEVICE_MAP", "false") == "true":  # the reference's exact test
        return
    if verify_device_map(model):
        raise ValueError(DEVICE_MAP_TRAINING_ERROR)


def is_quantized_with_device_map(model: nn.Module) -> bool:
    """Whether `model` was loaded in 8-bit or 4-bit (bitsandbytes) with a device map: such a model
    stays where it was loaded (it cannot be moved with `.to()`)."""
    quantized = getattr(model, "is_loaded_in_8bit", False) or getattr(
        model, "is_loaded_in_4bit", False
    )
    return bool(quantized and getattr(model, "hf_device_map", None))


def check_quantized_model_placement(
    model: nn.Module,
    device: torch.device,
    distributed_type: Any,
    cpu_quantization: bool = False,
    xpu: bool = False,
) -> None:
    """Refuse to train an 8-bit / 4-bit model that is spread over several devices in a distributed
    mode, loaded on another device than this process's, or offloaded to the CPU or disk (as the
    reference does). `cpu_quantization`: bitsandbytes can run on the CPU (its multi-backend build)."""
    if not is_quantized_with_device_map(model):
        return
    devices = set(model.hf_device_map.values())
    if (
        len(devices) > 1
        and str(getattr(distributed_type, "value", distributed_type)).upper() != "NO"
    ):
        raise ValueError(
            "You can't train a model that has been loaded in 8-bit or 4-bit precision on multiple "
            "devices in any distributed mode: run one process (naive pipeline parallelism over the "
            "devices of its device map) instead."
        )
    if len(devices) == 1:
        (loaded_on,) = devices
        if isinstance(loaded_on, torch.device):
            index = loaded_on.index
        elif isinstance(loaded_on, str) and loaded_on != "disk":
            index = torch.device(loaded_on).index
        else:
            index = loaded_on if isinstance(loaded_on, int) else None
        on_cpu_with_cpu_kernels = device.type == "cpu" and cpu_quantization
        if (
            not on_cpu_with_cpu_kernels
            and loaded_on != "disk"
            and torch.device(device.type, index) != device
            and (device.index is not None or index != 0)  # device 0 of a one-device job is fine
        ):
            raise ValueError(
                "You can't train a model that has been loaded in 8-bit or 4-bit precision on a "
                f"different device than the one you're training on ({device}): load it with "
                "`device_map={'': accelerator.device}`."
            )
    if ("cpu" in devices and (not cpu_quantization or xpu)) or "disk" in devices:
        raise ValueError(
            "You can't train a model that has been loaded in 8-bit or 4-bit precision with CPU or "
            "disk offload: load it entirely on the training device (to train on the CPU, install "
            "bitsandbytes with its multi-backend support)."
        )


def offloaded_state_dict(model: nn.Module) -> Optional[dict[str, torch.Tensor]]:
    """The full state dict of a model with weights offloaded by hooks (onloaded module by module),
    or None when no module is offloaded (use the ordinary state dict then)."""
    if not any(has_offloaded_params(m) for m in model.modules()):
        return None
    return get_state_dict_offloaded_model(model)
