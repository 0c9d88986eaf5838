"""Helpers on `torch.nn.Module`s: unwrapping distributed containers, compiled-module checks,
regional compilation, module traversal, safetensors-ready state dicts, and small generic helpers
(`get_pretty_name`, `merge_dicts`, `recursive_getattr`, `convert_bytes`).
"""

from __future__ import annotations

import collections
import functools
import logging
from types import MethodType
from typing import Any

import torch

from ..core.availability import is_deepspeed_available
from ..precision.policy import remove_forward_wrapper

logger = logging.getLogger(__name__)


def _optimized_module_type() -> type | None:
    dynamo = getattr(torch, "_dynamo", None)
    return getattr(getattr(dynamo, "eval_frame", None), "OptimizedModule", None)


def is_compiled_module(module: torch.nn.Module) -> bool:
    """Whether `module` is the wrapper `torch.compile(model)` returns.

    Example:
        >>> is_compiled_module(torch.nn.Linear(1, 1))
        False

    Args:
        module (torch.nn.Module): The module to inspect.

    Returns:
        bool: True for torch's compiled wrapper (`OptimizedModule`).
    """
    optimized = _optimized_module_type()
    return optimized is not None and isinstance(module, optimized)


def has_compiled_regions(module: torch.nn.Module) -> bool:
    """Whether any submodule of `module` (itself included) was compiled with `torch.compile`.

    Args:
        module (torch.nn.Module): The model to inspect.

    Returns:
        bool: True when some submodule is a compiled wrapper.
    """
    optimized = _optimized_module_type()
    if optimized is None or not module._modules:
        return False
    return any(isinstance(submodule, optimized) for submodule in module.modules())


def is_repeated_blocks(module: torch.nn.Module) -> bool:
    """Whether `module` is a non-empty `ModuleList` whose children all share the first child's class.

    Args:
        module (torch.nn.Module): The module to inspect.

    Returns:
        bool: True for a `ModuleList` of blocks of one class.
    """
    return (
        isinstance(module, torch.nn.ModuleList)
        and len(module) > 0
        and all(isinstance(child, type(module[0])) for child in module)
    )


def has_repeated_blocks(module: torch.nn.Module) -> bool:
    """Whether `module` holds repeated blocks (see `is_repeated_blocks`) at any depth.

    Args:
        module (torch.nn.Module): The model to inspect.

    Returns:
        bool: True when some submodule is a `ModuleList` of blocks of one class.
    """
    if not module._modules:
        return False
    return any(is_repeated_blocks(submodule) for submodule in module.modules())


def _shallow_copy_with_children(
    module: torch.nn.Module, children: dict[str, torch.nn.Module]
) -> torch.nn.Module:
    copy = type(module).__new__(type(module))
    copy.__dict__.update(module.__dict__)
    # Methods bound to the original instance (e.g. a wrapped forward) must be rebound to the copy.
    for name, value in list(copy.__dict__.items()):
        if getattr(value, "__self__", None) is module and hasattr(value, "__func__"):
            copy.__dict__[name] = MethodType(value.__func__, copy)
    copy._modules = {}
    for name, child in children.items():
        copy.add_module(name, child)
    return copy


def compile_regions(module: torch.nn.Module, **compile_kwargs: Any) -> torch.nn.Module:
    """Compile each block of the repeated `ModuleList`s separately (they then share one compiled
    graph, so compilation is much faster than compiling the whole model) and the other leaves whole.

    The original module stays reachable as `result._orig_mod` so `extract_model_from_parallel`
    can undo it.

    Example:
        >>> model = torch.nn.Sequential(torch.nn.ModuleList([torch.nn.Linear(2, 2)] * 2))
        >>> compiled = compile_regions(model)
        >>> compiled._orig_mod is model
        True

    Args:
        module (torch.nn.Module): The model to compile.
        **compile_kwargs: Passed to each `torch.compile` call (mode, backend, fullgraph ...).

    Returns:
        torch.nn.Module: The compiled model (`module` itself is left unchanged).
    """

    def compile_part(part: torch.nn.Module) -> torch.nn.Module:
        if is_repeated_blocks(part):
            return torch.nn.ModuleList(torch.compile(block, **compile_kwargs) for block in part)
        if has_repeated_blocks(part):
            children = {name: compile_part(child) for name, child in part.named_children()}
            return _shallow_copy_with_children(part, children)
        return torch.compile(part, **compile_kwargs)

    result = compile_part(module)
    if "_orig_mod" not in result.__dict__:
        result.__dict__["_orig_mod"] = module
    return result


def _compile_in_place(module: torch.nn.Module, compile_kwargs: dict[str, Any]) -> None:
    if is_repeated_blocks(module):
        for block in module:
            block.compile(**compile_kwargs)
    elif has_repeated_blocks(module):
        for child in module.children():
            _compile_in_place(child, compile_kwargs)
    else:
        module.compile(**compile_kwargs)


def compile_regions_deepspeed(module: torch.nn.Module, **compile_kwargs: Any) -> None:
    """Regional compilation in place (`Module.compile()`), for the module inside a DeepSpeed engine.

    Args:
        module (torch.nn.Module): The model to compile in place.
        **compile_kwargs: Passed to each `Module.compile` call.
    """
    _compile_in_place(module, compile_kwargs)


def compile_regions_fsdp2(module: torch.nn.Module, **compile_kwargs: Any) -> torch.nn.Module:
    """Regional compilation in place (`Module.compile()`), which keeps the module's own call path so
    hooks FSDP2 installs later still run; returns `module`.

    Args:
        module (torch.nn.Module): The model to compile in place.
        **compile_kwargs: Passed to each `Module.compile` call.

    Returns:
        torch.nn.Module: `module`.
    """
    _compile_in_place(module, compile_kwargs)
    return module


def model_has_dtensor(model: torch.nn.Module) -> bool:
    """Whether any parameter of `model` is a DTensor (the model was sharded by FSDP2 or TP).

    Args:
        model (torch.nn.Module): The model to inspect.

    Returns:
        bool: True when some parameter is a `DTensor`.
    """
    from torch.distributed.tensor import DTensor

    return any(isinstance(parameter, DTensor) for parameter in model.parameters())


def get_model_tp_size(model: torch.nn.Module) -> int | None:
    """The tensor-parallel degree a Transformers model was sharded with, or None.

    Args:
        model (torch.nn.Module): The model; its `tp_size` or `config.distributed_config` is read.

    Returns:
        int | None: The tensor-parallel degree, or None when the model says nothing of it.
    """
    tp_size = getattr(model, "tp_size", None)
    if tp_size is not None:
        return tp_size
    distributed_config = getattr(getattr(model, "config", None), "distributed_config", None)
    if isinstance(distributed_config, dict):
        return distributed_config.get("tp_size")
    return getattr(distributed_config, "tp_size", None)


def _container_types() -> tuple[type, ...]:
    containers: tuple[type, ...] = (
        torch.nn.parallel.DistributedDataParallel,
        torch.nn.DataParallel,
    )
    if torch.distributed.is_available():
        from torch.distributed.fsdp import FullyShardedDataParallel

        containers += (FullyShardedDataParallel,)
    if is_deepspeed_available():
        import deepspeed  # optional dependency

        containers += (deepspeed.DeepSpeedEngine,)
    return containers


def _unwrap_children(module: torch.nn.Module) -> torch.nn.Module:
    inner = _unwrap_children(module.module) if hasattr(module, "module") else module
    for name, child in inner.named_children():
        setattr(inner, name, _unwrap_children(child))
    return inner


def extract_model_from_parallel(
    model: torch.nn.Module,
    keep_fp32_wrapper: bool = True,
    keep_torch_compile: bool = True,
    recursive: bool = False,
) -> torch.nn.Module:
    """The user's model inside DDP, DataParallel, FSDP1 or DeepSpeed containers.

    Args:
        model: the (possibly wrapped, possibly compiled) model.
        keep_fp32_wrapper: False removes the mixed-precision forward wrapper `prepare` added.
        keep_torch_compile: False returns the uncompiled module; True puts the unwrapped module
            back inside the compiled wrapper.
        recursive: also unwrap `.module` containers found among the children, at any depth.

    Example:
        >>> inner = torch.nn.Linear(2, 2)
        >>> extract_model_from_parallel(torch.nn.DataParallel(inner)) is inner
        True
    """
    compiled = None
    if is_compiled_module(model):
        compiled, model = model, model._orig_mod
    elif has_compiled_regions(model) and "_orig_mod" in model.__dict__:
        compiled, model = model, model.__dict__["_orig_mod"]

    containers = _container_types()
    while isinstance(model, containers):
        model = model.module
    if recursive:
        model = _unwrap_children(model)
    if not keep_fp32_wrapper:
        remove_forward_wrapper(model)
    if keep_torch_compile and compiled is not None:
        if is_compiled_module(compiled):
            compiled._orig_mod = model
        else:
            compiled.__dict__["_orig_mod"] = model
        return compiled
    return model


def get_module_children_bottom_up(
    model: torch.nn.Module, return_fqns: bool = False
) -> list[torch.nn.Module] | list[tuple[str, torch.nn.Module]]:
    """All submodules, children before their parents; the last entry is `model` itself.

    With `return_fqns=True` each entry is `(qualified name, module)` (`""` for `model`).

    Example:
        >>> net = torch.nn.Sequential(torch.nn.Linear(1, 1))
        >>> [name for name, _ in get_module_children_bottom_up(net, return_fqns=True)]
        ['0', '']

    Args:
        model (torch.nn.Module): The root module.
        return_fqns (bool): Return `(name, module)` pairs instead of modules (default False).

    Returns:
        list[torch.nn.Module] | list[tuple[str, torch.nn.Module]]: The modules, deepest first.
    """
    pending: list[tuple[str, torch.nn.Module]] = [("", model)]
    visited: list[tuple[str, torch.nn.Module]] = []
    while pending:
        prefix, module = pending.pop()
        for name, child in module.named_children():
            pending.append((f"{prefix}.{name}" if prefix else name, child))
        visited.append((prefix, module))
    visited.reverse()
    return visited if return_fqns else [module for _, module in visited]


def _storage_key(tensor: torch.Tensor) -> tuple[Any, int, int]:
    storage = tensor.untyped_storage()
    return tensor.device, storage.data_ptr(), storage.nbytes()


def clean_state_dict_for_safetensors(state_dict: dict[str, Any]) -> dict[str, Any]:
    """Drop all but the first of the names that share one tensor storage (safetensors refuses
    aliases; tied weights are the usual case) and make every tensor contiguous.

    Example:
        >>> weight = torch.ones(2)
        >>> sorted(clean_state_dict_for_safetensors({"a": weight, "b": weight}))
        ['a']

    Args:
        state_dict (dict[str, Any]): The state dict; aliases are removed from it in place.

    Returns:
        dict[str, Any]: The remaining entries, tensors made contiguous.
    """
    by_storage: dict[Any, list[str]] = collections.defaultdict(list)
    for name, value in state_dict.items():
        if isinstance(value, torch.Tensor):
            by_storage[_storage_key(value)].append(name)
    dropped = set()
    for names in by_storage.values():
        for name in names[1:]:
            state_dict.pop(name, None)
            dropped.add(name)
    if dropped:
        # A warning here, as in the reference: this is the public `save()` path. save_state and
        # save_model drop tied weights through checkpointing's dedupe, at debug level.
        logger.warning(
            f"Removed shared tensors {sorted(dropped)} while saving (they alias another entry); "
            "loading into the same model restores them from the entry they alias."
        )
    return {k: v.contiguous() if isinstance(v, torch.Tensor) else v for k, v in state_dict.items()}


def get_pretty_name(obj: Any) -> str:
    """A readable name for a class, function or instance (its qualified name, else `str(obj)`).

    Example:
        >>> get_pretty_name(torch.nn.Linear(1, 1))
        'Linear'

    Args:
        obj (Any): A class, function or any object.

    Returns:
        str: Its name.
    """
    if not hasattr(obj, "__qualname__") and not hasattr(obj, "__name__"):
        obj = getattr(obj, "__class__", obj)
    for attribute in ("__qualname__", "__name__"):
        if hasattr(obj, attribute):
            return getattr(obj, attribute)
    return str(obj)


def merge_dicts(source: dict, destination: dict) -> dict:
    """Merge `source` into `destination` recursively (nested dicts merged, other values replaced);
    returns `destination`.

    Example:
        >>> merge_dicts({"a": {"b": 1}}, {"a": {"c": 2}, "d": 3})
        {'a': {'c': 2, 'b': 1}, 'd': 3}

    Args:
        source (dict): The values to bring in.
        destination (dict): The dict updated in place.

    Returns:
        dict: `destination`.
    """
    for key, value in source.items():
        if isinstance(value, dict):
            merge_dicts(value, destination.setdefault(key, {}))
        else:
            destination[key] = value
    return destination


def recursive_getattr(obj: Any, attr: str) -> Any:
    """`getattr` along a dotted path.

    Example:
        >>> recursive_getattr(torch.nn.Sequential(torch.nn.Linear(1, 2)), "0.out_features")
        2

    Args:
        obj (Any): The object to start from.
        attr (str): Attribute names joined by dots, e.g. "encoder.layer.0".

    Returns:
        The attribute at the end of the path.

    Raises:
        AttributeError: A name on the path that does not exist.
    """
    return functools.reduce(getattr, attr.split("."), obj)


def convert_bytes(size: float) -> str:
    """A byte count in the largest unit below 1024 (bytes, KB, ... PB), rounded to 2 decimals.

    Example:
        >>> convert_bytes(1536)
        '1.5 KB'

    Args:
        size (float): A number of bytes.

    Returns:
        str: The size with its unit, e.g. "1.5 KB".
    """
    for unit in ("bytes", "KB", "MB", "GB", "TB"):
        if size < 1024.0:
            return f"{round(size, 2)} {unit}"
        size /= 1024.0
    return f"{round(size, 2)} PB"
