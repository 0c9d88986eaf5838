"""The device mesh of a ParallelismConfig, and tensor parallelism applied through a model's plan.

A plan maps module names (with `*` wildcards, e.g. "layers.*.mlp.up") to a style: a
`torch.distributed.tensor.parallel.ParallelStyle`, or one of the names "colwise", "rowwise",
"colwise_rep", "rowwise_rep", "sequence_parallel". It comes from `TorchTensorParallelConfig(tp_plan=...)`
or from the model (`model.tp_plan` / `model._tp_plan`); a callable plan is called as `plan(model, mesh)`
and parallelizes the model itself. A model whose parameters are already DTensors is left as it is.
"""

from __future__ import annotations

from typing import Any

import torch

from ..core.input_errors import rank_prefix
from .context import StrategyContext


def device_mesh(config: Any, device: torch.device) -> Any:
    """The whole device mesh of a ParallelismConfig, or None when it spans only one process."""
    if config is None or config.total_size <= 1:
        return None
    return config.get_device_mesh(device.type)


def fsdp_mesh(context: StrategyContext) -> Any:
    """The sub-mesh FSDP shards over: the ParallelismConfig's, else one dimension over every process.

    The mesh is always built on the run's own device type: left to itself, `fully_shard` builds its
    default mesh on CUDA whenever a GPU is visible, even in a `--cpu` run on gloo.
    """
    mesh = device_mesh(context.parallelism_config, context.device)
    if mesh is not None:
        return mesh[tuple(context.parallelism_config.fsdp_dim_names)]
    from torch.distributed.device_mesh import init_device_mesh

    return init_device_mesh(context.device.type, (context.num_processes,))


def tp_mesh(context: StrategyContext) -> Any:
    """The tensor-parallel sub-mesh (None without tensor parallelism)."""
    config = context.parallelism_config
    if config is None or not config.tp_enabled:
        return None
    return device_mesh(config, context.device)["tp"]


def _style(value: Any) -> Any:
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        SequenceParallel,
    )

    if not isinstance(value, str):
        return value
    styles = {
        "colwise": lambda: ColwiseParallel(),
        "rowwise": lambda: RowwiseParallel(),
        "colwise_rep": lambda: ColwiseParallel(output_layouts=Replicate()),
        "rowwise_rep": lambda: RowwiseParallel(input_layouts=Replicate()),
        "sequence_parallel": lambda: SequenceParallel(),
    }
    if value not in styles:
        raise ValueError(
            f"Unknown tensor parallel style {value!r}: use one of {', '.join(styles)} or a "
            "torch.distributed.tensor.parallel.ParallelStyle."
        )
    return styles[value]()


def _plan_for(context: StrategyContext, model: torch.nn.Module) -> Any:
    handler = getattr(context.parallelism_config, "tp_handler", None)
    plan = getattr(handler, "tp_plan", None)
    if plan is None:
        plan = getattr(model, "tp_plan", None) or getattr(model, "_tp_plan", None)
    return plan


def tensor_parallel_plan(context: StrategyContext, model: torch.nn.Module) -> Any:
    """The tensor parallel plan for `model`: the config's `tp_plan`, else the model's own (or None)."""
    return _plan_for(context, model)


def parallel_style(value: Any) -> Any:
    """The torch `ParallelStyle` of a plan entry (a style, or one of the names this module lists)."""
    return _style(value)


def has_dtensor_parameters(model: torch.nn.Module) -> bool:
    """Whether any of the model's parameters is a DTensor."""
    from torch.distributed.tensor import DTensor

    return any(isinstance(p, DTensor) for p in model.parameters())


def check_plan(model: torch.nn.Module, plan: Any) -> None:
    """Every plan entry must name at least one module: a typo would silently skip tensor parallelism."""
    import fnmatch

    if not isinstance(plan, dict):
        return
    names = [name for name, _ in model.named_modules() if name]
    for pattern in plan:
        if not any(fnmatch.fnmatchcase(name, pattern) for name in names):
            raise ValueError(
                f"{rank_prefix()}The tensor parallel plan names {pattern!r}, which matches no module of "
                f"{type(model).__name__}. Module names are like: {', '.join(names[:8])}."
            )
        _style(plan[pattern])


def maybe_apply_tensor_parallel(
    context: StrategyContext, model: torch.nn.Module
) -> torch.nn.Module:
    """Split the model's layers over the `tp` mesh dimension when tp_size > 1; a no-op otherwise."""
    mesh = tp_mesh(context)
    if mesh is None or has_dtensor_parameters(model):
        return model
    plan = _plan_for(context, model)
    if plan is None:
        raise ValueError(
            f"tp_size={context.parallelism_config.tp_size} needs a tensor parallel plan: give the "
            "model a `tp_plan` dict (module name -> 'colwise' / 'rowwise' / ParallelStyle), pass "
            "ParallelismConfig(tp_handler=TorchTensorParallelConfig(tp_plan=...)), or load the model "
            "already parallelized (DTensor parameters)."
        )
    if callable(plan):
        result = plan(model, mesh)
        return model if result is None else result
    check_plan(model, plan)
    from torch.distributed.tensor.parallel import parallelize_module

    return parallelize_module(model, mesh, {name: _style(style) for name, style in plan.items()})
