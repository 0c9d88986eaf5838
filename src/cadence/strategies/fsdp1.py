"""FSDP version 1 (`FullyShardedDataParallel` wrapper): parameters flattened per unit and sharded.

On CPU three FSDP1 features do not work (CPU offload of parameters, `sync_module_states`, and gathering
a full state dict with `offload_to_cpu=True`, which leaves the other rank waiting forever). Cadence
rejects the first with a clear error, does the second itself (a broadcast from the main process before
wrapping) and never asks for the third.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Iterable
from typing import Any

import torch
import torch.distributed as dist

from ..core.torch_compat import FSDP1_UNEVEN_SHARDED_STATE, ranks_without_a_chunk, refuse_before
from .fsdp_policy import ignored_modules
from .param_remap import canonical_name, named_parameters
from .sharded import ShardedStrategy


def _is_fsdp1(model: Any) -> bool:
    from torch.distributed.fsdp import FullyShardedDataParallel

    return isinstance(model, FullyShardedDataParallel)


def _broadcast_module_states(model: torch.nn.Module, device: torch.device) -> None:
    """What `sync_module_states=True` does, done with plain broadcasts (FSDP1's own fails on CPU)."""
    if any(t.is_meta for t in list(model.parameters()) + list(model.buffers())):
        model.to_empty(device=device)
    with torch.no_grad():
        for tensor in list(model.parameters()) + list(model.buffers()):
            dist.broadcast(tensor.data, src=0)


class FSDP1Strategy(ShardedStrategy):
    """FSDP version 1: the model is wrapped in `FullyShardedDataParallel` (flat parameters)."""

    name = "fsdp1"

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self._flat_of: dict[int, tuple[weakref.ref, torch.nn.Parameter]] = {}
        # The unsharded shape of each parameter of each wrapped model (by id): what the sharded
        # state dict splits across the ranks.
        self._full_shapes: dict[int, dict[str, tuple[int, ...]]] = {}

    @property
    def _on_cpu(self) -> bool:
        return self.context.device.type == "cpu"

    def wrap_model(self, model: torch.nn.Module, evaluation_mode: bool) -> torch.nn.Module:
        """Wrap the model in FullyShardedDataParallel per the plugin (no-op if wrapped)."""
        if _is_fsdp1(model):
            return model
        from torch.distributed.fsdp import FullyShardedDataParallel

        plugin = self.plugin
        plugin.set_auto_wrap_policy(model)  # raises on a layer class the model does not have
        before = named_parameters(model)
        sync_module_states = bool(plugin.sync_module_states)
        if sync_module_states and self._on_cpu:
            _broadcast_module_states(model, self.context.device)
            sync_module_states = False
        kwargs: dict[str, Any] = {
            "sharding_strategy": plugin.sharding_strategy or plugin.reshard_after_forward,
            "cpu_offload": plugin.cpu_offload,
            "auto_wrap_policy": plugin.auto_wrap_policy,
            "mixed_precision": plugin.mixed_precision_policy,
            "sync_module_states": sync_module_states,
            "backward_prefetch": plugin.backward_prefetch,
            "forward_prefetch": bool(plugin.forward_prefetch),
            "use_orig_params": bool(plugin.use_orig_params),
            "limit_all_gathers": plugin.limit_all_gathers,
            "device_id": _fsdp_device(self.context.device),
        }
        if plugin.param_init_fn is not None:
            kwargs["param_init_fn"] = plugin.param_init_fn
        ignored = ignored_modules(plugin, model)
        if ignored:
            kwargs["ignored_modules"] = ignored
        shapes = {
            name: tuple(p.shape) for name, p in before.items()
        }  # before sharding resizes them
        wrapped = FullyShardedDataParallel(model, **kwargs)
        self._full_shapes[id(wrapped)] = shapes
        if plugin.activation_checkpointing:
            self._checkpoint_layers(wrapped)
        if not plugin.use_orig_params:
            self._record_flat_parameters(wrapped, before)
        return wrapped

    def _refuse_short_sharded_state(self, models: Any) -> None:
        """torch 2.7 cannot build FSDP1's sharded state dict when a rank holds no part of a
        parameter ("Only single local shard is supported", on that rank only: the others would
        wait forever). The shapes are the same on every rank, so every rank refuses, before
        anything is written or loaded."""
        if self._full_checkpoints or not dist.is_initialized():
            return
        world = dist.get_world_size()
        for model in models:
            short = ranks_without_a_chunk(self._full_shapes.get(id(model), {}), world)
            if short:
                refuse_before(
                    FSDP1_UNEVEN_SHARDED_STATE,
                    f"[rank {dist.get_rank()}] An FSDP1 SHARDED_STATE_DICT on {world} processes "
                    f"of a model whose parameter(s) {', '.join(short[:3])}"
                    f"{' ...' if len(short) > 3 else ''} have fewer than {world} rows",
                    "a rank holding no part of a parameter fails in torch: 'Only single local "
                    "shard is supported'",
                    "use state_dict_type FULL_STATE_DICT, or fewer processes",
                )

    def save_sharded_state(
        self, directory: Any, models: Any, optimizers: Any, **layout: Any
    ) -> list[str]:
        """As `ShardedStrategy.save_sharded_state`; refused first where torch cannot (see above)."""
        self._refuse_short_sharded_state([self._state_model(m) for m in models])
        return super().save_sharded_state(directory, models, optimizers, **layout)

    def load_sharded_state(
        self, directory: Any, models: Any, optimizers: Any, open_file: Any = None, **layout: Any
    ) -> None:
        """As `ShardedStrategy.load_sharded_state`; refused first where torch cannot (see above)."""
        self._refuse_short_sharded_state([self._state_model(m) for m in models])
        super().load_sharded_state(directory, models, optimizers, open_file, **layout)

    def _checkpoint_layers(self, wrapped: torch.nn.Module) -> None:
        import functools

        from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
            CheckpointImpl,
            apply_activation_checkpointing,
            checkpoint_wrapper,
        )

        if self.plugin.auto_wrap_policy is None:
            raise ValueError(
                "activation_checkpointing=True needs an auto wrap policy to choose the layers to "
                "checkpoint (transformer_based_wrap or size_based_wrap)."
            )
        apply_activation_checkpointing(
            wrapped,
            checkpoint_wrapper_fn=functools.partial(
                checkpoint_wrapper, checkpoint_impl=CheckpointImpl.NO_REENTRANT
            ),
            auto_wrap_policy=self.plugin.auto_wrap_policy,
        )

    def _record_flat_parameters(self, wrapped: torch.nn.Module, before: dict[str, Any]) -> None:
        """Remember which flat parameter holds each original parameter (for optimizers built earlier)."""
        from torch.distributed.fsdp import FullyShardedDataParallel

        for name, module in wrapped.named_modules():
            if not isinstance(module, FullyShardedDataParallel) or module._handle is None:
                continue
            flat = module._handle.flat_param
            prefix = canonical_name(name)
            for fqn in flat._fqns:
                original = before.get(canonical_name(f"{prefix}.{fqn}" if prefix else fqn))
                if original is not None:
                    self._flat_of[id(original)] = (weakref.ref(original), flat)

    def adopt_optimizer(self, optimizer: torch.optim.Optimizer) -> None:
        """Point an optimizer built on the original parameters at the flat parameters that replaced them."""
        owner: dict[int, int] = {}
        changed = False
        for index, group in enumerate(optimizer.param_groups):
            params: list[torch.Tensor] = []
            for param in group["params"]:
                entry = self._flat_of.get(id(param))
                target = entry[1] if entry is not None and entry[0]() is param else param
                changed |= target is not param
                if owner.setdefault(id(target), index) != index:
                    raise ValueError(
                        "This optimizer puts parameters of one FSDP unit into different parameter groups, "
                        "which FSDP1 cannot keep apart once it flattens them. Set use_orig_params=True "
                        "(--fsdp_use_orig_params true), use FSDP2, or build the optimizer from "
                        "model.parameters() after prepare()."
                    )
                if not any(target is p for p in params):
                    params.append(target)
            group["params"] = params
        if changed and optimizer.state:
            raise ValueError(
                "This optimizer already has state for the original parameters, which cannot be moved to "
                "FSDP1's flat parameters. Prepare the model before the first optimizer step, or set "
                "use_orig_params=True."
            )

    def unwrap(self, model: torch.nn.Module) -> torch.nn.Module:
        """The module inside any FSDP1 wrappers."""
        while _is_fsdp1(model):
            model = model.module
        return model

    def is_wrapped(self, model: Any) -> bool:
        """Whether `model` is a FullyShardedDataParallel wrapper."""
        return _is_fsdp1(model)

    def no_sync(self, model: Any) -> contextlib.AbstractContextManager:
        """FSDP1's `no_sync()` for a wrapped model: gradients are not reduced in backward."""
        if _is_fsdp1(model):
            return model.no_sync()
        return contextlib.nullcontext()

    def clip_grad_norm_(
        self, parameters: Iterable[torch.Tensor], max_norm: float, norm_type: float
    ) -> torch.Tensor:
        """Clip a whole prepared model's gradients via FSDP1; raises for a subset of parameters."""
        wanted = {id(p) for p in parameters}
        for model in self.prepared.models:
            if _is_fsdp1(model) and wanted == {id(p) for p in model.parameters()}:
                return model.clip_grad_norm_(max_norm, norm_type)
        raise ValueError(
            "With FSDP1, clip_grad_norm_ clips a whole prepared model: pass model.parameters() of the "
            "model returned by prepare() (the gradients are sharded, so a subset cannot be measured "
            "globally). FSDP2 (fsdp_version=2) can clip any subset."
        )

    # -- state dicts: never ask FSDP1 to offload a full state dict on CPU --------------------------------
    @property
    def _full_state_offload(self) -> bool:  # type: ignore[override]
        return not self._on_cpu

    def state_dict(self, model: torch.nn.Module, unwrap: bool = True) -> dict[str, Any]:
        """The full state dict on rank 0 (on CPU unless training on CPU); {} elsewhere."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        offload = self._full_state_offload
        options = StateDictOptions(full_state_dict=True, cpu_offload=offload)
        state = get_model_state_dict(model, options=options)
        if not offload and dist.get_rank() != 0:
            return {}
        return state


def _fsdp_device(device: torch.device) -> torch.device:
    # FSDP1 compares device_id with where the module's tensors are; CPU tensors report plain `cpu`.
    return torch.device("cpu") if device.type == "cpu" else device
