"""What the sharded backends (FSDP2, FSDP1, tensor parallel) share: re-pointing an optimizer at the
sharded parameters, clipping by the global norm, and checkpoints through torch.distributed.checkpoint."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import torch

from .base import Strategy
from .grad_norm import clip_grad_norm_global
from .param_remap import ParameterRemap
from .sharded_state import full_model_state_dict, load_sharded, save_sharded


class ShardedStrategy(Strategy):
    """What the sharded backends share: optimizer re-pointing, global clipping, sharded checkpoints."""

    saves_sharded_state = True

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.remap = ParameterRemap()

    @property
    def plugin(self) -> Any:
        """The FullyShardedDataParallelPlugin (None without FSDP)."""
        return self.context.fsdp_plugin

    def adopt_optimizer(self, optimizer: torch.optim.Optimizer) -> None:
        """Point the optimizer at the sharded parameters that replaced the originals."""
        self.remap.apply(optimizer)

    def clip_grad_norm_(
        self, parameters: Iterable[torch.Tensor], max_norm: float, norm_type: float
    ) -> torch.Tensor:
        """Clip by the norm over all ranks' shards; returns that global norm."""
        return clip_grad_norm_global(list(parameters), max_norm, norm_type)

    def clip_grad_value_(self, parameters: Iterable[torch.Tensor], clip_value: float) -> None:
        # Each shard clips its own values: elementwise clipping needs no communication.
        """Clamp each local gradient shard to [-clip_value, clip_value] (no communication)."""
        for p in parameters:
            if p.grad is not None:
                grad = p.grad
                local = grad.to_local() if hasattr(grad, "to_local") else grad
                local.clamp_(-clip_value, clip_value)

    # Full state dicts are gathered into the main process's CPU memory (FSDP1 on CPU cannot).
    _full_state_offload = True

    def _state_model(self, model: Any) -> torch.nn.Module:
        """The module whose state dict is the checkpoint: the prepared model without torch.compile."""
        return getattr(model, "_orig_mod", model)

    def state_dict(self, model: torch.nn.Module, unwrap: bool = True) -> dict[str, Any]:
        """The whole state dict, gathered on the main process (on CPU); an empty dict elsewhere."""

        return full_model_state_dict(self._state_model(model))

    @property
    def _full_checkpoints(self) -> bool:
        plugin = self.plugin
        return plugin is not None and not plugin.is_sharded_state_dict

    def _owners(self, models: Sequence[Any], optimizers: Sequence[Any]) -> list[Any]:
        """For each optimizer, the model whose parameters it trains."""
        owners = []
        for optimizer in optimizers:
            inner = getattr(optimizer, "optimizer", optimizer)
            ids = {id(p) for g in inner.param_groups for p in g["params"]}
            owner = next(
                (m for m in models if any(id(p) in ids for p in m.parameters())), models[0]
            )
            owners.append(owner)
        return owners

    def save_sharded_state(
        self,
        directory: Any,
        models: Sequence[Any],
        optimizers: Sequence[Any],
        *,
        full: bool | None = None,
        first_index: int = 0,
        optimizer_models: Sequence[Any] | None = None,
    ) -> list[str]:
        """Write models' and optimizers' state into `directory`; return the files this rank wrote.

        Collective: every rank calls it with the same models and optimizers. `full` (default: the
        plugin's state_dict_type) picks the layout, `first_index` the first number in the file names,
        `optimizer_models` the model each optimizer trains (default: found among `models`).
        """

        models = [self._state_model(m) for m in models]
        owners = [self._state_model(m) for m in optimizer_models or ()]
        return save_sharded(
            directory,
            models,
            optimizers,
            full=self._full_checkpoints if full is None else full,
            optimizer_models=owners or self._owners(models, optimizers),
            offload=self._full_state_offload,
            first_index=first_index,
        )

    def load_sharded_state(
        self,
        directory: Any,
        models: Sequence[Any],
        optimizers: Sequence[Any],
        open_file: Any = None,
        *,
        full: bool | None = None,
        first_index: int = 0,
        optimizer_models: Sequence[Any] | None = None,
    ) -> None:
        """Load what `save_sharded_state` wrote (possibly by another number of processes). Collective.

        `open_file(name)`: the checkpoint reader's opener of verified file content (see `load_sharded`);
        `full`, `first_index`, `optimizer_models`: as in `save_sharded_state`.
        """

        models = [self._state_model(m) for m in models]
        owners = [self._state_model(m) for m in optimizer_models or ()]
        load_sharded(
            directory,
            models,
            optimizers,
            full=self._full_checkpoints if full is None else full,
            optimizer_models=owners or self._owners(models, optimizers),
            open_file=open_file,
            first_index=first_index,
        )
