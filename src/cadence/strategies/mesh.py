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


def parallelism_config(accelerator: Any) -> Any:
    return getattr(accelerator.state, "parallelism_config", None)


def device_mesh(accelerator: Any) -> Any:
    """The whole device mesh, or None when no ParallelismConfig asks for more than one process."""
    config = parallelism_config(accelerator)
    if config is None or config.total_size <= 1:
        return None
    return config.get_device_mesh(accelerator.device.type)


def fsdp_mesh(accelerator: Any) -> Any:
    mesh = device_mesh(accelerator)
    if mesh is None:
        return None
    return mesh[tuple(parallelism_config(accelerator).fsdp_dim_names)]


def tp_mesh(accelerator: Any) -> Any:
    config = parallelism_config(accelerator)
    if config is None or not config.tp_enabled:
        return None
    return device_mesh(accelerator)["tp"]


def data_parallel_coordinates(accelerator: Any) -> tuple[int, int]:
    """(index, count) of this process among the data-parallel replicas: ranks that share a TP / CP
    group read the same batches."""
    config = parallelism_config(accelerator)
    if config is None or config.non_data_parallel_size <= 1:
        return accelerator.process_index, accelerator.num_processes
    mesh = device_mesh(accelerator)
    if not config.dp_dim_names:
        return 0, 1
    dp = mesh["dp"]
    return dp.get_local_rank(), dp.size()


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


def _plan_for(accelerator: Any, model: torch.nn.Module) -> Any:
    handler = getattr(parallelism_config(accelerator), "tp_handler", None)
    plan = getattr(handler, "tp_plan", None)
    if plan is None:
        plan = getattr(model, "tp_plan", None) or getattr(model, "_tp_plan", None)
    return plan


def has_dtensor_parameters(model: torch.nn.Module) -> bool:
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
            from ..plugins._env import rank_prefix

            raise ValueError(
                f"{rank_prefix()}The tensor parallel plan names {pattern!r}, which matches no module of "
                f"{type(model).__name__}. Module names are like: {', '.join(names[:8])}."
            )
        _style(plan[pattern])


def maybe_apply_tensor_parallel(accelerator: Any, model: torch.nn.Module) -> torch.nn.Module:
    """Split the model's layers over the `tp` mesh dimension when tp_size > 1; a no-op otherwise."""
    mesh = tp_mesh(accelerator)
    if mesh is None or has_dtensor_parameters(model):
        return model
    plan = _plan_for(accelerator, model)
    if plan is None:
        raise ValueError(
            f"tp_size={parallelism_config(accelerator).tp_size} needs a tensor parallel plan: give the "
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
