"""What the Accelerator does with a model dispatched over devices: refuse to train it in distributed
mode, and save its full weights (offloaded ones included)."""

from __future__ import annotations

from typing import Any, Optional

import torch
from torch import nn

from ..settings import env_text
from .tensors import get_state_dict_offloaded_model, has_offloaded_params

DEVICE_MAP_TRAINING_ERROR = (
    "You can't train a model that has been loaded with `device_map='auto'` in any distributed mode."
    " Please rerun your script specifying `--num_processes=1` or by launching with `python {{myscript.py}}`."
)


def verify_device_map(model: nn.Module) -> bool:
    """True when `model` (or a submodule) was dispatched with a device map of more than one entry.

    Example:
    ```py
    >>> verify_device_map(dispatch_model(model, {"0": "cpu", "1": "disk"}, offload_dir="offload"))
    True
    ```
    """
    return any(len(getattr(m, "hf_device_map", None) or {}) > 1 for m in model.modules())


def check_model_is_trainable(model: nn.Module, distributed_type: Any) -> None:
    """Raise the reference's ValueError when a dispatched model is prepared in a distributed mode
    (`distributed_type` is anything but "NO"); ACCELERATE_BYPASS_DEVICE_MAP=true skips the check."""
    name = getattr(distributed_type, "value", distributed_type)
    if str(name).upper() == "NO":
        return
    if env_text("ACCELERATE_BYPASS_DEVICE_MAP", "false") == "true":  # the reference's exact test
        return
    if verify_device_map(model):
        raise ValueError(DEVICE_MAP_TRAINING_ERROR)


def offloaded_state_dict(model: nn.Module) -> Optional[dict[str, torch.Tensor]]:
    """The full state dict of a model with weights offloaded by hooks (onloaded module by module),
    or None when no module is offloaded (use the ordinary state dict then)."""
    if not any(has_offloaded_params(m) for m in model.modules()):
        return None
    return get_state_dict_offloaded_model(model)
