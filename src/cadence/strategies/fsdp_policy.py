"""Which submodules get their own FSDP unit / activation checkpoint, and which are left out."""

from __future__ import annotations

import functools
import inspect
import re
from collections.abc import Callable
from typing import Any

import torch

ModulePredicate = Callable[[torch.nn.Module], bool]


def _unwrapped(module: torch.nn.Module) -> torch.nn.Module:
    return getattr(module, "_checkpoint_wrapped_module", module)


def _own_numel(module: torch.nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def wrap_predicate(plugin: Any, model: torch.nn.Module) -> ModulePredicate | None:
    """A `module -> bool` test from the plugin's auto wrap policy (bound to `model`), or None."""
    from torch.distributed.fsdp.wrap import (
        size_based_auto_wrap_policy,
        transformer_auto_wrap_policy,
    )

    plugin.set_auto_wrap_policy(model)
    policy = plugin.auto_wrap_policy
    if policy is None:
        return None
    base = policy.func if isinstance(policy, functools.partial) else policy
    if base is transformer_auto_wrap_policy:
        classes = tuple(plugin.layer_classes(model))
        if not classes:
            return None
        return lambda module: isinstance(_unwrapped(module), classes)
    if base is size_based_auto_wrap_policy:
        limit = int(plugin.min_num_params or 0)
        return lambda module: _own_numel(module) > limit
    return _user_predicate(policy)


def _user_predicate(policy: Callable[..., bool]) -> ModulePredicate:
    """Accept both `policy(module)` and FSDP1's `policy(module, recurse, nonwrapped_numel)`."""
    try:
        takes_one = len(inspect.signature(policy).parameters) == 1
    except (TypeError, ValueError):
        takes_one = False
    if takes_one:
        return lambda module: bool(policy(module))
    return lambda module: bool(
        policy(module=module, recurse=False, nonwrapped_numel=_own_numel(module))
    )


def matching_submodules(
    model: torch.nn.Module, predicate: ModulePredicate
) -> list[tuple[str, torch.nn.Module]]:
    """Submodules (not `model` itself) for which `predicate` holds, deepest first."""
    found = [(name, module) for name, module in model.named_modules() if name and predicate(module)]
    return sorted(found, key=lambda item: item[0].count("."), reverse=True)


def apply_activation_checkpointing(
    model: torch.nn.Module, predicate: ModulePredicate | None, offload: bool = False
) -> torch.nn.Module:
    """Wrap every outermost matching submodule so its activations are recomputed in backward."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
        checkpoint_wrapper,
        offload_wrapper,
    )

    if predicate is None:
        raise ValueError(
            "activation_checkpointing=True needs an auto wrap policy to choose the layers to "
            "checkpoint: set auto_wrap_policy='transformer_based_wrap' with "
            "transformer_cls_names_to_wrap, or 'size_based_wrap' with min_num_params."
        )
    chosen: list[str] = []
    for name, module in model.named_modules():
        if not name or any(name.startswith(c + ".") for c in chosen):
            continue
        if predicate(module):
            chosen.append(name)
    for name in chosen:
        wrapped = checkpoint_wrapper(model.get_submodule(name), preserve_rng_state=False)
        if offload:
            wrapped = offload_wrapper(wrapped)
        model.set_submodule(name, wrapped)
    return model


def ignored_modules(plugin: Any, model: torch.nn.Module) -> list[torch.nn.Module]:
    """The modules named by `plugin.ignored_modules` (a regex on module names, or modules)."""
    spec = plugin.ignored_modules
    if spec is None:
        return []
    if isinstance(spec, str):
        pattern = re.compile(spec)
        return [module for name, module in model.named_modules() if pattern.fullmatch(name)]
    return list(spec)
