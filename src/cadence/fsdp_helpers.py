"""FSDP helpers of the public API (Accelerate's `fsdp_utils`): RAM-efficient-loading switches,
parameter-name canonicalisation, the FSDP2 grad scaler, optimizer parameter switching, wrap policy.

`save_fsdp_model` / `load_fsdp_model` / `save_fsdp_optimizer` / `load_fsdp_optimizer` write and
read Accelerate's FSDP layout through the Accelerator's sharded strategy (the same code as
`Accelerator.save_state`, see `cadence.strategies.sharded_state`); the preparation steps that take
the Accelerator raise and point to `Accelerator.prepare`.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

import torch

from .checkpointing.merge import merge_fsdp_weights
from .plugins.fsdp import find_module_class
from .strategies.fsdp_policy import wrap_predicate

if TYPE_CHECKING:
    from .accelerator import Accelerator
    from .plugins.fsdp import FullyShardedDataParallelPlugin

_USE_ACCELERATOR = (
    "Cadence does this inside `Accelerator.prepare`, `Accelerator.save_state`/`load_state` and "
    "`Accelerator.save_model`; use those."
)


def _through_accelerator(name: str) -> NotImplementedError:
    return NotImplementedError(
        f"`{name}` (Accelerate's internal FSDP step) is not provided. {_USE_ACCELERATOR}"
    )


def enable_fsdp_ram_efficient_loading() -> None:
    """Let Transformers load FSDP models on rank 0 only (`FSDP_CPU_RAM_EFFICIENT_LOADING=True`)."""
    os.environ.setdefault("ACCELERATE_USE_FSDP", "True")
    os.environ["FSDP_CPU_RAM_EFFICIENT_LOADING"] = "True"


def disable_fsdp_ram_efficient_loading() -> None:
    """Load FSDP models on every rank (`FSDP_CPU_RAM_EFFICIENT_LOADING=False`)."""
    os.environ["FSDP_CPU_RAM_EFFICIENT_LOADING"] = "False"


def fsdp2_canonicalize_names(named_params: dict[str, Any]) -> dict[str, Any]:
    """Parameter names without the `_checkpoint_wrapped_module` and `_orig_mod` parts that
    activation checkpointing and `torch.compile` insert.

    Example:
        >>> fsdp2_canonicalize_names({"_orig_mod.layer._checkpoint_wrapped_module.w": 1})
        {'layer.w': 1}

    Args:
        named_params (dict[str, Any]): Values by parameter name.

    Returns:
        dict[str, Any]: The same values under the cleaned names.
    """
    out = {}
    for name, value in named_params.items():
        name = name.replace("._checkpoint_wrapped_module", "")
        name = name.removeprefix("_orig_mod.")
        out[name.replace("._orig_mod", "")] = value
    return out


def get_fsdp2_grad_scaler(**kwargs: Any) -> torch.amp.GradScaler:
    """A `torch.amp.GradScaler` built with `kwargs` (FSDP2 uses the plain scaler).

    Args:
        **kwargs: Passed to `torch.amp.GradScaler` (init_scale, growth_interval ...).

    Returns:
        torch.amp.GradScaler: The scaler.
    """
    return torch.amp.GradScaler(**kwargs)


def fsdp2_switch_optimizer_parameters(
    optimizer: torch.optim.Optimizer, mapping: dict[Any, Any]
) -> None:
    """Replace, in place, each optimizer parameter by `mapping[param.data_ptr]` (its sharded version).

    Raises:
        KeyError: a parameter has no entry in `mapping` (training would silently not update it).

    Args:
        optimizer (torch.optim.Optimizer): The optimizer created from the unsharded model.
        mapping (dict[Any, Any]): The sharded parameter by the data pointer of the original one.
    """
    try:
        for group in optimizer.param_groups:
            group["params"] = [mapping[param.data_ptr] for param in group["params"]]
    except KeyError:
        raise KeyError(
            "A parameter in the optimizer couldn't be switched to its sharded version. This breaks the training: "
            "create the optimizer from the model's parameters before calling prepare()."
        ) from None


def get_parameters_from_modules(
    modules: Iterable[torch.nn.Module] | str | None, model: torch.nn.Module, device: Any
) -> set[torch.nn.Parameter]:
    """The parameters of `modules`; a string is a regex matched against `model`'s module names (the
    matching modules are moved to `device`).

    Args:
        modules (Iterable[torch.nn.Module] | str | None): Modules, or a regular expression their full
            names must match; None means none.
        model (torch.nn.Module): The model the names are looked up in.
        device (Any): Where modules matched by name are moved.

    Returns:
        set[torch.nn.Parameter]: Their parameters.
    """
    if modules is None:
        return set()
    if isinstance(modules, str):
        pattern = re.compile(modules)
        matched = []
        for name, module in model.named_modules():
            if pattern.fullmatch(name):
                module.to(device)
                matched.append(module)
        modules = matched
    return {parameter for module in modules for parameter in module.parameters()}


def ensure_weights_retied(
    param_init_fn: Callable[[torch.nn.Module], Any], model: torch.nn.Module, device: torch.device
) -> Callable[[torch.nn.Module], Any]:
    """Wrap an FSDP `param_init_fn` so weights listed in `model._tied_weights_keys` stay tied after
    initialisation (it re-assigns the first initialised copy to the other names).

    Args:
        param_init_fn (Callable[[torch.nn.Module], Any]): The initialisation function FSDP calls on each
            module materialised from the meta device.
        model (torch.nn.Module): The model, whose `_tied_weights_keys` names the tied weights.
        device (torch.device): Accepted for Accelerate's signature; unused.

    Returns:
        Callable[[torch.nn.Module], Any]: The wrapped function (`param_init_fn` itself when nothing is
        tied).
    """
    tied_names = getattr(model, "_tied_weights_keys", None)
    if not tied_names:
        return param_init_fn
    tied_ids = set()
    for name in tied_names:
        owner, _, attribute = name.rpartition(".")
        tied_ids.add(id(getattr(model.get_submodule(owner), attribute)))
    initialised: dict[int, torch.nn.Parameter] = {}

    def init_keeping_ties(module: torch.nn.Module) -> Any:
        before = {n: id(p) for n, p in module.named_parameters(recurse=False) if id(p) in tied_ids}
        result = param_init_fn(module)
        for name, original_id in before.items():
            if original_id in initialised:
                setattr(module, name, initialised[original_id])
            else:
                initialised[original_id] = getattr(module, name)
        return result

    return init_keeping_ties


def fsdp2_prepare_auto_wrap_policy(
    fsdp2_plugin: FullyShardedDataParallelPlugin, model: torch.nn.Module
) -> Callable[[torch.nn.Module], bool] | None:
    """The plugin's auto wrap policy as a `module -> bool` test for `model` (None: no policy).

    Args:
        fsdp2_plugin (FullyShardedDataParallelPlugin): The plugin whose auto wrap policy is read.
        model (torch.nn.Module): The model the policy is applied to.

    Returns:
        Callable[[torch.nn.Module], bool] | None: True for each module to shard on its own.
    """
    return wrap_predicate(fsdp2_plugin, model)


def get_module_class_from_name(module: torch.nn.Module, name: str) -> type | None:
    """The class named `name` among `module` and its submodules, or None.

    Example:
        >>> get_module_class_from_name(torch.nn.Sequential(torch.nn.ReLU()), "ReLU")
        <class 'torch.nn.modules.activation.ReLU'>

    Args:
        module (torch.nn.Module): The model to search.
        name (str): A class name, e.g. "LlamaDecoderLayer".

    Returns:
        type | None: The class.
    """
    return find_module_class(module, name)


def fsdp2_prepare_model(accelerator: Accelerator, model: torch.nn.Module) -> torch.nn.Module:
    """Shard a model with FSDP2 (done by `Accelerator.prepare` in Cadence).

    Args:
        accelerator (Accelerator): The Accelerator.
        model (torch.nn.Module): The model.

    Raises:
        NotImplementedError: Always: Cadence does this inside the Accelerator; call `Accelerator.prepare` instead.
    """
    raise _through_accelerator("fsdp2_prepare_model")


def fsdp2_apply_ac(accelerator: Accelerator, model: torch.nn.Module) -> torch.nn.Module:
    """Apply activation checkpointing for FSDP2 (done by `Accelerator.prepare` in Cadence).

    Args:
        accelerator (Accelerator): The Accelerator.
        model (torch.nn.Module): The model.

    Raises:
        NotImplementedError: Always: Cadence does this inside the Accelerator; call `Accelerator.prepare` with activation checkpointing in the FSDP plugin instead.
    """
    raise _through_accelerator("fsdp2_apply_ac")


def fsdp2_load_full_state_dict(
    accelerator: Accelerator, model: torch.nn.Module, full_sd: dict, cpu_offload: bool = False
) -> None:
    """Load a full state dict into an FSDP2 model (done by `Accelerator.prepare` in Cadence).

    Args:
        accelerator (Accelerator): The Accelerator.
        model (torch.nn.Module): The FSDP model.
        full_sd (dict): The full (unsharded) state dict.
        cpu_offload (bool): Whether the sharded parameters live on the CPU.

    Raises:
        NotImplementedError: Always: Cadence does this inside the Accelerator; call `Accelerator.prepare` instead.
    """
    raise _through_accelerator("fsdp2_load_full_state_dict")


def _sharded_strategy(accelerator: Accelerator, fsdp_plugin: Any, name: str) -> Any:
    """The strategy that owns the FSDP state of `accelerator`, after checking what Accelerate's
    `name` accepts that Cadence cannot write in Accelerate's layout (refused before any file)."""
    from .strategies.sharded import (
        ShardedStrategy,  # deferred: the sharded backends load when FSDP is used
    )

    strategy = getattr(accelerator, "_strategy", None)
    if not isinstance(strategy, ShardedStrategy) or strategy.plugin is None:
        raise ValueError(
            f"`{name}` saves or loads the state of a model prepared with FSDP, but this Accelerator "
            "does not use FSDP: create it with `fsdp_plugin=FullyShardedDataParallelPlugin(...)` "
            "(or `cadence launch --use_fsdp`), or use `accelerator.save_state` / `load_state`."
        )
    kind = getattr(getattr(fsdp_plugin, "state_dict_type", None), "name", None)
    if kind == "LOCAL_STATE_DICT":
        raise ValueError(
            f"`{name}` with state_dict_type LOCAL_STATE_DICT is not supported by Cadence: use "
            "SHARDED_STATE_DICT (a torch.distributed.checkpoint folder any number of processes "
            "can load) or FULL_STATE_DICT."
        )
    return strategy


def _check_layout(name: str, adapter_only: bool, use_dcp: bool) -> None:
    if adapter_only:
        raise ValueError(
            f"`{name}(..., adapter_only=True)` is not supported by Cadence: save the whole model "
            "(adapter_only=False), or save the adapter with PEFT's own `save_pretrained`."
        )
    if not use_dcp:
        raise ValueError(
            f"`{name}(..., use_dcp=False)` (per-rank torch.save shards) is not supported by "
            "Cadence: use the default use_dcp=True (a torch.distributed.checkpoint folder)."
        )


def _is_full(fsdp_plugin: Any) -> bool:
    return getattr(getattr(fsdp_plugin, "state_dict_type", None), "name", None) != (
        "SHARDED_STATE_DICT"
    )


def save_fsdp_model(
    fsdp_plugin: Any,
    accelerator: Accelerator,
    model: torch.nn.Module,
    output_dir: str,
    model_index: int = 0,
    adapter_only: bool = False,
    use_dcp: bool = True,
) -> None:
    """Save the weights of a model prepared with FSDP (1 or 2) in Accelerate's layout, as the
    plugin's `state_dict_type` says: SHARDED_STATE_DICT writes the torch.distributed.checkpoint
    folder `output_dir/pytorch_model_fsdp_{model_index}` (every rank its shard; `cadence
    merge-weights` turns it into one file), FULL_STATE_DICT the main process's
    `pytorch_model_fsdp.bin` (`pytorch_model_fsdp_{model_index}.bin` after the first).

    Collective: every process calls it. `adapter_only=True`, `use_dcp=False` and LOCAL_STATE_DICT
    are refused (before anything is written).

    Args:
        fsdp_plugin (FullyShardedDataParallelPlugin): The plugin the model was prepared with
            (`accelerator.state.fsdp_plugin`); its `state_dict_type` picks the layout.
        accelerator (Accelerator): The Accelerator that prepared the model.
        model (torch.nn.Module): The prepared model.
        output_dir (str): The folder to write into (created if missing).
        model_index (int): The model's number among the prepared models (0 by default); it
            names the files after the first.
        adapter_only (bool): Accelerate's PEFT-adapter-only save; refused (False by default).
        use_dcp (bool): Write through torch.distributed.checkpoint (True by default); False,
            Accelerate's per-rank shards, is refused.

    Raises:
        ValueError: `adapter_only=True`, `use_dcp=False`, a LOCAL_STATE_DICT plugin, or an
            Accelerator that does not run FSDP (before any file is touched).

    Example:
        >>> save_fsdp_model(accelerator.state.fsdp_plugin, accelerator, model, "ckpt")  # doctest: +SKIP
    """
    _check_layout("save_fsdp_model", adapter_only, use_dcp)
    strategy = _sharded_strategy(accelerator, fsdp_plugin, "save_fsdp_model")
    strategy.save_sharded_state(
        output_dir, [model], [], full=_is_full(fsdp_plugin), first_index=model_index
    )


def load_fsdp_model(
    fsdp_plugin: Any,
    accelerator: Accelerator,
    model: torch.nn.Module,
    input_dir: str,
    model_index: int = 0,
    adapter_only: bool = False,
    use_dcp: bool = True,
) -> None:
    """Load into a model prepared with FSDP what `save_fsdp_model` (Cadence's or Accelerate's)
    wrote in `input_dir`; a sharded folder loads on any number of processes. Collective.

    Args:
        fsdp_plugin (FullyShardedDataParallelPlugin): The plugin the model was prepared with
            (`accelerator.state.fsdp_plugin`); its `state_dict_type` picks the layout.
        accelerator (Accelerator): The Accelerator that prepared the model.
        model (torch.nn.Module): The prepared model to load into.
        input_dir (str): The folder `save_fsdp_model` wrote into.
        model_index (int): The model's number, as given when saving (0 by default).
        adapter_only (bool): Accelerate's PEFT-adapter-only load; refused (False by default).
        use_dcp (bool): Read through torch.distributed.checkpoint (True by default); False is refused.

    Raises:
        ValueError: `adapter_only=True`, `use_dcp=False`, a LOCAL_STATE_DICT plugin, or an
            Accelerator that does not run FSDP (before any file is touched).

    Example:
        >>> load_fsdp_model(accelerator.state.fsdp_plugin, accelerator, model, "ckpt")  # doctest: +SKIP
    """
    _check_layout("load_fsdp_model", adapter_only, use_dcp)
    strategy = _sharded_strategy(accelerator, fsdp_plugin, "load_fsdp_model")
    strategy.load_sharded_state(
        input_dir, [model], [], full=_is_full(fsdp_plugin), first_index=model_index
    )


def save_fsdp_optimizer(
    fsdp_plugin: Any,
    accelerator: Accelerator,
    optimizer: torch.optim.Optimizer,
    model: torch.nn.Module,
    output_dir: str,
    optimizer_index: int = 0,
    use_dcp: bool = True,
) -> None:
    """Save the state of an optimizer of a model prepared with FSDP in Accelerate's layout: the
    folder `output_dir/optimizer_{optimizer_index}` (SHARDED_STATE_DICT) or the main process's
    `optimizer.bin` / `optimizer_{optimizer_index}.bin` (FULL_STATE_DICT). Collective.

    Args:
        fsdp_plugin (FullyShardedDataParallelPlugin): The plugin the model was prepared with
            (`accelerator.state.fsdp_plugin`); its `state_dict_type` picks the layout.
        accelerator (Accelerator): The Accelerator that prepared the model.
        optimizer (torch.optim.Optimizer): The prepared optimizer.
        model (torch.nn.Module): The prepared model the optimizer steps.
        output_dir (str): The folder to write into (created if missing).
        optimizer_index (int): The optimizer's number among the prepared ones (0 by default).
        use_dcp (bool): Write through torch.distributed.checkpoint (True by default); False is refused.

    Raises:
        ValueError: `adapter_only=True`, `use_dcp=False`, a LOCAL_STATE_DICT plugin, or an
            Accelerator that does not run FSDP (before any file is touched).

    Example:
        >>> save_fsdp_optimizer(accelerator.state.fsdp_plugin, accelerator, optimizer, model, "ckpt")  # doctest: +SKIP
    """
    _check_layout("save_fsdp_optimizer", False, use_dcp)
    strategy = _sharded_strategy(accelerator, fsdp_plugin, "save_fsdp_optimizer")
    strategy.save_sharded_state(
        output_dir,
        [],
        [optimizer],
        full=_is_full(fsdp_plugin),
        first_index=optimizer_index,
        optimizer_models=[model],
    )


def load_fsdp_optimizer(
    fsdp_plugin: Any,
    accelerator: Accelerator,
    optimizer: torch.optim.Optimizer,
    model: torch.nn.Module,
    input_dir: str,
    optimizer_index: int = 0,
    adapter_only: bool = False,
    use_dcp: bool = True,
) -> None:
    """Load into `optimizer` (of `model`, prepared with FSDP) what `save_fsdp_optimizer` wrote in
    `input_dir`. Collective.

    Args:
        fsdp_plugin (FullyShardedDataParallelPlugin): The plugin the model was prepared with
            (`accelerator.state.fsdp_plugin`); its `state_dict_type` picks the layout.
        accelerator (Accelerator): The Accelerator that prepared the model.
        optimizer (torch.optim.Optimizer): The prepared optimizer to load into.
        model (torch.nn.Module): The prepared model the optimizer steps.
        input_dir (str): The folder `save_fsdp_optimizer` wrote into.
        optimizer_index (int): The optimizer's number, as given when saving (0 by default).
        adapter_only (bool): Accelerate's PEFT-adapter-only load; refused (False by default).
        use_dcp (bool): Read through torch.distributed.checkpoint (True by default); False is refused.

    Raises:
        ValueError: `adapter_only=True`, `use_dcp=False`, a LOCAL_STATE_DICT plugin, or an
            Accelerator that does not run FSDP (before any file is touched).

    Example:
        >>> load_fsdp_optimizer(accelerator.state.fsdp_plugin, accelerator, optimizer, model, "ckpt")  # doctest: +SKIP
    """
    _check_layout("load_fsdp_optimizer", adapter_only, use_dcp)
    strategy = _sharded_strategy(accelerator, fsdp_plugin, "load_fsdp_optimizer")
    strategy.load_sharded_state(
        input_dir,
        [],
        [optimizer],
        full=_is_full(fsdp_plugin),
        first_index=optimizer_index,
        optimizer_models=[model],
    )


__all__ = [
    "disable_fsdp_ram_efficient_loading",
    "enable_fsdp_ram_efficient_loading",
    "ensure_weights_retied",
    "fsdp2_apply_ac",
    "fsdp2_canonicalize_names",
    "fsdp2_load_full_state_dict",
    "fsdp2_prepare_auto_wrap_policy",
    "fsdp2_prepare_model",
    "fsdp2_switch_optimizer_parameters",
    "get_fsdp2_grad_scaler",
    "get_module_class_from_name",
    "get_parameters_from_modules",
    "load_fsdp_model",
    "load_fsdp_optimizer",
    "merge_fsdp_weights",
    "save_fsdp_model",
    "save_fsdp_optimizer",
]
