"""XLA devices (TPU, or torch_xla's CPU device) through torch_xla.

One replica per process (what `xmp.spawn` starts): the model is moved to the XLA device with its tied
weights re-tied, an optimizer built before prepare() is pointed at the moved parameters, gradients are
all-reduced once per optimizer step (before `clip_grad_norm_` when it runs, else just before the step),
and the lazy graph is cut after each optimizer step.

Several devices in one process go through SPMD (`torch_xla.runtime.use_spmd()`), chosen from the
existing configuration: a `ParallelismConfig(dp_replicate_size=N)` shards each batch over a "data"
mesh axis (data parallelism; the compiler inserts the gradient all-reduce), an FSDP plugin or
`ParallelismConfig(dp_shard_size=N)` also shards the parameters with torch_xla's
`SpmdFullyShardedDataParallel` (FSDPv2) over an "fsdp" axis.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

from ..core.prepared import PreparedObjects
from ..precision.policy import Precision
from ..xla import runtime as xla_runtime
from ..xla.spmd import SpmdPlan, spmd_plan
from .base import Strategy
from .context import StrategyContext


def _tied_groups(model: torch.nn.Module) -> list[list[str]]:
    """Names of parameters that are one Parameter object (tied weights), in groups of two or more."""
    by_identity: dict[int, list[str]] = {}
    for name, parameter in model.named_parameters(remove_duplicate=False):
        by_identity.setdefault(id(parameter), []).append(name)
    return [names for names in by_identity.values() if len(names) > 1]


def _set_parameter(model: torch.nn.Module, name: str, parameter: torch.nn.Parameter) -> None:
    owner_name, _, attribute = name.rpartition(".")
    owner = model.get_submodule(owner_name) if owner_name else model
    setattr(owner, attribute, parameter)


class XLAStrategy(Strategy):
    """Training on XLA devices: one replica per process, or SPMD over the devices of one process."""

    name = "xla"

    def __init__(
        self, context: StrategyContext, precision: Precision, prepared: PreparedObjects
    ) -> None:
        super().__init__(context, precision, prepared)
        self.plan = spmd_plan(
            context.fsdp_plugin,
            context.parallelism_config,
            context.num_processes,
            xla_runtime.device_count,
        )
        self.mesh = self._start_spmd(self.plan) if self.plan is not None else None
        # id(parameter before the move) -> the parameter on the XLA device.
        self._moved: dict[int, torch.nn.Parameter] = {}
        self._gradients_reduced = False

    @staticmethod
    def _start_spmd(plan: SpmdPlan) -> Any:
        import numpy as np

        xs = xla_runtime.spmd()
        if not xla_runtime.spmd_active():
            raise RuntimeError(
                "The FSDP plugin / ParallelismConfig asks for SPMD over the XLA devices, but this process "
                "used its XLA device before SPMD could be switched on (PartialState() or an XLA tensor came "
                "first). Create the Accelerator with the plugin before anything touches the XLA device."
            )
        count = int(np.prod(plan.shape))
        mesh = xs.Mesh(np.arange(count), plan.shape, plan.axes)
        xs.set_global_mesh(mesh)
        return mesh

    @property
    def replicas(self) -> int:
        """Number of processes whose gradients are averaged at each step (1 under SPMD)."""
        return self.context.num_processes

    # -- the model ------------------------------------------------------------------------------
    def place_model(self, model: torch.nn.Module) -> torch.nn.Module:
        """Move `model` to the XLA device; tied weights (which the move unties) are tied again."""
        before = {
            name: parameter for name, parameter in model.named_parameters(remove_duplicate=False)
        }
        groups = _tied_groups(model)
        model.to(self.context.device)
        after = dict(model.named_parameters(remove_duplicate=False))
        for names in groups:
            for name in names[1:]:
                _set_parameter(model, name, after[names[0]])
        after = dict(model.named_parameters(remove_duplicate=False))
        for name, old in before.items():
            if old is not after[name]:
                self._moved[id(old)] = after[name]
        return model

    def wrap_model(self, model: torch.nn.Module, evaluation_mode: bool) -> torch.nn.Module:
        """FSDPv2 (SpmdFullyShardedDataParallel) under an "fsdp" plan; the model itself otherwise."""
        if self.plan is None or self.plan.mode != "fsdp":
            return model
        from torch_xla.experimental.spmd_fully_sharded_data_parallel import (  # optional dependency
            SpmdFullyShardedDataParallel,
        )

        extra = "data" if "data" in self.plan.axes else None
        return SpmdFullyShardedDataParallel(model, mesh=self.mesh, extra_data_axis=extra)

    def is_wrapped(self, model: Any) -> bool:
        """Whether `model` is an FSDPv2 wrapper."""
        return type(model).__name__ == "SpmdFullyShardedDataParallel" and hasattr(model, "module")

    def unwrap(self, model: torch.nn.Module) -> torch.nn.Module:
        """The module inside an FSDPv2 wrapper (the model itself otherwise)."""
        return model.module if self.is_wrapped(model) else model

    def state_dict(self, model: torch.nn.Module, unwrap: bool = True) -> dict[str, Any]:
        """The model's weights as CPU copies (the pending graph is run first)."""
        xla_runtime.sync()
        state = super().state_dict(model, unwrap)
        return {
            key: value.detach().to("cpu") if isinstance(value, torch.Tensor) else value
            for key, value in state.items()
        }

    def backward(self, loss: torch.Tensor, **kwargs: Any) -> None:
        """Back-propagate (bf16 needs no loss scaling); explains torch's engine error after a CPU backward."""
        try:
            super().backward(loss, **kwargs)
        except RuntimeError as error:
            if "device_ready_queues_" not in str(error):
                raise
            raise RuntimeError(
                "A backward pass ran on another device before this process first used its XLA device, "
                "so torch's autograd engine has no queue for XLA devices. Create the Accelerator before "
                "any backward pass in this process."
            ) from error

    # -- the optimizer --------------------------------------------------------------------------
    def adopt_optimizer(self, optimizer: torch.optim.Optimizer) -> None:
        """Point an optimizer built before prepare() at the moved parameters, and hook its step: the
        gradient all-reduce (once) before it, a graph cut after it."""
        if self._moved:
            for group in optimizer.param_groups:
                group["params"] = [self._moved.get(id(p), p) for p in group["params"]]
            state = {self._moved.get(id(p), p): value for p, value in optimizer.state.items()}
            optimizer.state.clear()
            optimizer.state.update(state)
        optimizer.register_step_pre_hook(self._before_step)
        optimizer.register_step_post_hook(self._after_step)

    def _before_step(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        if self.replicas > 1 and not self._gradients_reduced:
            xla_runtime.xm().reduce_gradients(optimizer)
        self._gradients_reduced = False

    def _after_step(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        xla_runtime.sync()  # the step boundary: run this step's graph

    def reduce_gradients(self, parameters: Iterable[torch.Tensor]) -> None:
        """Average the gradients of `parameters` over the replicas (once per optimizer step)."""
        if self.replicas <= 1 or self._gradients_reduced:
            return
        gradients = [p.grad for p in parameters if p.grad is not None]
        if gradients:
            xm = xla_runtime.xm()
            xm.all_reduce(xm.REDUCE_SUM, gradients, scale=1.0 / self.replicas)
        self._gradients_reduced = True

    def clip_grad_norm_(
        self, parameters: Iterable[torch.Tensor], max_norm: float, norm_type: float
    ) -> torch.Tensor:
        """All-reduce the gradients first (so every replica clips the same averaged gradient), then clip."""
        parameters = list(parameters)
        self.reduce_gradients(parameters)
        return torch.nn.utils.clip_grad_norm_(parameters, max_norm, norm_type=norm_type)

    def clip_grad_value_(self, parameters: Iterable[torch.Tensor], clip_value: float) -> None:
        """All-reduce the gradients first, then clamp them."""
        parameters = list(parameters)
        self.reduce_gradients(parameters)
        torch.nn.utils.clip_grad_value_(parameters, clip_value)

    # -- batches --------------------------------------------------------------------------------
    def wrap_data_loader(self, loader: Any) -> Any:
        """The loader itself (its batches reach the device through `data.xla_transfer`), or, with
        CADENCE_XLA_MP_DEVICE_LOADER=1, the loader read through torch_xla's MpDeviceLoader."""
        if not xla_runtime.mp_device_loader_requested():
            return loader
        from ..data.xla_transfer import (
            wrap_in_mp_device_loader,  # deferred: loads torch_xla's loader only when asked for
        )

        loader.device = None  # host batches: MpDeviceLoader moves them
        return wrap_in_mp_device_loader(loader, self.context.device)
