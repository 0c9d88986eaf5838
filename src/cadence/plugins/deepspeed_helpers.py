"""DeepSpeed helpers of the public API: the active `DeepSpeedPlugin` and the CPU-offload optimizer
matching a torch optimizer. The engine/optimizer/scheduler wrappers live in
`cadence.strategies.deepspeed`."""

from __future__ import annotations

from typing import Any

import torch

from ..core.enums import DistributedType


def get_active_deepspeed_plugin(state: Any) -> Any:
    """The selected `DeepSpeedPlugin` of an `AcceleratorState`.

    Raises:
        ValueError: DeepSpeed is not the distributed type of `state`.

    Args:
        state (Any): The `AcceleratorState`.

    Returns:
        The selected `DeepSpeedPlugin`.
    """
    if state.distributed_type != DistributedType.DEEPSPEED:
        raise ValueError(
            "Couldn't retrieve the active `DeepSpeedPlugin` as none were enabled. Please make sure that either "
            "`Accelerator` is configured for `deepspeed` or make sure that the desired `DeepSpeedPlugin` has been "
            "enabled (`AcceleratorState().select_deepspeed_plugin(name)`) before calling this function."
        )
    plugins = state.deepspeed_plugins
    if not isinstance(plugins, dict):
        return plugins
    return next(plugin for plugin in plugins.values() if getattr(plugin, "selected", False))


def map_pytorch_optim_to_deepspeed(optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
    """DeepSpeed's CPU optimizer equivalent to `optimizer` (for ZeRO optimizer offload): CPU Adagrad
    for `Adagrad`, CPU Adam otherwise (AdamW mode for `AdamW`), with the same lr and weight decay,
    on the same parameter groups. Needs DeepSpeed's compiled CPU ops.

    Args:
        optimizer (torch.optim.Optimizer): The torch optimizer to replace.

    Returns:
        torch.optim.Optimizer: DeepSpeed's CPU optimizer.
    """
    defaults = {k: v for k, v in optimizer.defaults.items() if k in ("lr", "weight_decay")}
    if isinstance(optimizer, torch.optim.Adagrad):
        from deepspeed.ops.adagrad import DeepSpeedCPUAdagrad  # optional dependency

        return DeepSpeedCPUAdagrad(optimizer.param_groups, **defaults)
    from deepspeed.ops.adam import DeepSpeedCPUAdam  # optional dependency

    return DeepSpeedCPUAdam(
        optimizer.param_groups, adamw_mode=isinstance(optimizer, torch.optim.AdamW), **defaults
    )
