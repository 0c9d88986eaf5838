"""FSDP2 (`torch.distributed.fsdp.fully_shard`): each rank keeps a shard of every parameter, gradient
and optimizer state; parameters are all-gathered per unit for forward and backward.

The model stays the user's object (fully_shard changes it in place), so `unwrap_model` returns it as is.
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch

from ..core.torch_compat import FSDP2_ON_CPU, FSDP2_ON_GLOO, HSDP_ON_GLOO, refuse_before
from .fsdp_policy import (
    apply_activation_checkpointing,
    ignored_modules,
    matching_submodules,
    wrap_predicate,
)
from .mesh import fsdp_mesh, maybe_apply_tensor_parallel
from .param_remap import named_parameters
from .sharded import ShardedStrategy


def is_fsdp2_module(model: Any) -> bool:
    """Whether `model` was sharded with FSDP2's `fully_shard`."""
    from torch.distributed.fsdp import FSDPModule

    return isinstance(model, FSDPModule)


class FSDPStrategy(ShardedStrategy):
    """FSDP version 2: `fully_shard` turns parameters into DTensors sharded over the mesh."""

    name = "fsdp2"
    runs_context_parallel = True

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self._non_persistent: dict[str, torch.Tensor] = {}

    def wrap_model(self, model: torch.nn.Module, evaluation_mode: bool) -> torch.nn.Module:
        """Shard the model with `fully_shard` (after checkpointing / tensor parallel if asked)."""
        if is_fsdp2_module(model):
            return model

        plugin = self.plugin
        self._refuse_where_torch_is_wrong()
        # Everything that can fail on bad input runs before the first collective.
        predicate = wrap_predicate(plugin, model)
        self.prepare_context_parallel(model)
        before = named_parameters(model)
        if plugin.activation_checkpointing:
            apply_activation_checkpointing(
                model, predicate, offload=plugin.activation_checkpointing_offload
            )
        self._upcast_trainable_parameters(model)
        model = maybe_apply_tensor_parallel(self.context, model)
        kwargs = self._fully_shard_kwargs(model, fsdp_mesh(self.context))
        full_state = self._detach_for_efficient_loading(model)
        self._shard(model, predicate, kwargs)
        if full_state is not None:
            self._load_from_main_process(model, full_state)
        self.remap.record(before, named_parameters(model))
        return model

    # -- steps of wrap_model -----------------------------------------------------------------------
    def _refuse_where_torch_is_wrong(self) -> None:
        """FSDP2 on CPU (gloo) before the torch release where its numbers are right: refused, never run
        (core/torch_compat.py has the releases)."""
        if self.context.device.type != "cpu":
            return
        refuse_before(
            FSDP2_ON_CPU,
            "FSDP2 (fully_shard) on CPU",
            "torch 2.6's fully_shard calls Stream.record_event, which a CPU stream lacks",
            "run on GPUs, or use FSDP version 1 (fsdp_version=1)",
        )
        if not self.context.use_distributed:
            return
        refuse_before(
            FSDP2_ON_GLOO,
            "FSDP2 (fully_shard) on CPU/gloo",
            "torch 2.6's fully_shard fails on CPU, 2.7's and 2.8's give gradients that differ "
            "from one process's",
            "run on GPUs (NCCL), or use FSDP version 1 (fsdp_version=1)",
        )
        config = self.context.parallelism_config
        if config is not None and getattr(config, "dp_replicate_size", 1) > 1:
            refuse_before(
                HSDP_ON_GLOO,
                "HSDP (dp_replicate_size > 1) on CPU/gloo",
                "torch 2.7's gloo has no ReduceOp.AVG, 2.8's numbers differ from one process's",
                "run on GPUs (NCCL)",
            )

    def _upcast_trainable_parameters(self, model: torch.nn.Module) -> None:
        # fully_shard needs one dtype per unit; mixed precision keeps fp32 masters and casts for compute.
        if not self.precision.casts_parameters:
            return
        for param in model.parameters():
            if param.requires_grad and param.is_floating_point() and param.dtype != torch.float32:
                param.data = param.data.to(torch.float32)

    def _fully_shard_kwargs(self, model: torch.nn.Module, mesh: Any) -> dict[str, Any]:
        from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy

        plugin = self.plugin
        offload = plugin.cpu_offload
        if (
            isinstance(offload, CPUOffloadPolicy)
            and offload.pin_memory
            and not torch.cuda.is_available()
        ):
            offload = CPUOffloadPolicy(pin_memory=False)  # pinned memory needs a GPU driver
        kwargs: dict[str, Any] = {
            "reshard_after_forward": plugin.reshard_after_forward,
            "offload_policy": offload,
            "mp_policy": plugin.mixed_precision_policy or MixedPrecisionPolicy(),
            "mesh": mesh,
        }
        ignored = ignored_modules(plugin, model)
        if ignored:
            kwargs["ignored_params"] = {p for m in ignored for p in m.parameters()}
        return kwargs

    def _detach_for_efficient_loading(self, model: torch.nn.Module) -> dict[str, Any] | None:
        """With cpu_ram_efficient_loading, shard on the meta device and fill from the main process later."""
        if not self.plugin.cpu_ram_efficient_loading:
            return None
        state = model.state_dict() if self.context.is_main_process else {}
        self._non_persistent = {
            name: buffer.clone()
            for name, buffer in model.named_buffers()
            if name not in model.state_dict()
        }
        model.to(torch.device("meta"))
        return state

    def _load_from_main_process(self, model: torch.nn.Module, state: dict[str, Any]) -> None:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

        device = self.context.device
        model.to_empty(device=device)
        options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
        set_model_state_dict(model, state, options=options)
        for name, buffer in self._non_persistent.items():
            owner_name, _, leaf = name.rpartition(".")
            owner = model.get_submodule(owner_name) if owner_name else model
            owner.register_buffer(leaf, buffer.to(device), persistent=False)

    def _shard(self, model: torch.nn.Module, predicate: Any, kwargs: dict[str, Any]) -> None:
        from torch.distributed.fsdp import FSDPModule, fully_shard

        if predicate is not None:
            for _, module in matching_submodules(model, predicate):
                if not isinstance(module, FSDPModule):
                    fully_shard(module, **kwargs)
        # The root's parameters are needed again right at the start of backward: keep them gathered.
        root_kwargs = dict(kwargs, reshard_after_forward=False)
        fully_shard(model, **root_kwargs)

    # -- the training step ------------------------------------------------------------------------
    @contextlib.contextmanager
    def no_sync(self, model: Any):
        """Accumulate unsharded gradients locally; no reduce-scatter, no resharding until the sync step."""
        if not is_fsdp2_module(model):
            yield
            return
        model.set_requires_gradient_sync(False)
        model.set_reshard_after_backward(False)
        try:
            yield
        finally:
            model.set_requires_gradient_sync(True)
            model.set_reshard_after_backward(True)
