"""Giving this process's stages real weights when the model was built on the meta device
(`init_empty_weights`, `torch.device("meta")`): only the stages a process runs are ever allocated, so a
model larger than one process's memory can be trained.

Each module holding meta tensors gets new ones on the device, initialized as the model would
initialize them: a transformers model's `_init_weights(module)`, else the module's
`reset_parameters()`. The values are a fresh initialization, not those a one-process run would draw
(the random streams differ); load a checkpoint (`accelerator.load_state`) for a given start.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from ...core.input_errors import rank_prefix


def _initializer(model: torch.nn.Module, module: torch.nn.Module, name: str):
    init_weights = getattr(model, "_init_weights", None)
    if callable(init_weights) and hasattr(model, "config"):  # a transformers model
        return lambda: init_weights(module)
    reset = getattr(module, "reset_parameters", None)
    if callable(reset):
        return reset
    raise ValueError(
        f"{rank_prefix()}{name} ({type(module).__name__}) has weights on the meta device and no "
        "reset_parameters() to initialize them: build the model with its weights, or give the "
        "module a reset_parameters()."
    )


def plan_materialization(model: torch.nn.Module, stages: Sequence[torch.nn.Module]) -> list[Any]:
    """What `materialize` will do for the meta tensors of `stages` (nothing when there are none):
    every module is checked here, before anything is changed.

    Raises:
        ValueError: A module with meta weights that Cadence cannot initialize.
    """
    work = []
    for stage in stages:
        for name, module in stage.named_modules():
            params = [n for n, p in module.named_parameters(recurse=False) if p.is_meta]
            buffers = [n for n, b in module.named_buffers(recurse=False) if b.is_meta]
            if params or buffers:
                work.append((module, params, buffers, _initializer(model, module, name)))
    return work


def materialize(work: list[Any], device: torch.device) -> None:
    """Replace the meta tensors that `plan_materialization` found by initialized ones on `device`."""
    for module, params, buffers, initialize in work:
        for name in params:
            old = module._parameters[name]
            fresh = torch.empty_like(old, device=device)
            module._parameters[name] = torch.nn.Parameter(fresh, requires_grad=old.requires_grad)
        for name in buffers:
            module._buffers[name] = torch.empty_like(module._buffers[name], device=device)
        with torch.no_grad():
            initialize()


def rebuild_rotary(model: torch.nn.Module, name: str, device: torch.device) -> None:
    """A transformers rotary embedding whose buffers are on the meta device is built again from the
    model's config (it holds no weights, only the frequencies computed from the config)."""
    rotary = model.get_submodule(name)
    if not any(b.is_meta for b in rotary.buffers()):
        return
    try:
        fresh = type(rotary)(config=getattr(rotary, "config", model.config)).to(device)
    except TypeError as error:
        raise ValueError(
            f"{rank_prefix()}{name} ({type(rotary).__name__}) is on the meta device and cannot be "
            f"built again from the model's config ({error}): create the model with real buffers "
            "(init_empty_weights() leaves buffers alone by default)."
        ) from None
    parent_name, _, leaf = name.rpartition(".")
    parent = model.get_submodule(parent_name) if parent_name else model
    setattr(parent, leaf, fresh)
