"""Tensor parallelism alone (ParallelismConfig(tp_size=N) over all N processes): each layer named in the
model's plan is split across ranks, and every rank sees the same batches. Composed with FSDP2 (2-D),
the FSDP strategy applies the same plan before sharding."""

from __future__ import annotations

import torch

from .mesh import maybe_apply_tensor_parallel
from .param_remap import named_parameters
from .sharded import ShardedStrategy


class TPStrategy(ShardedStrategy):
    """Tensor parallelism alone: layers are split across ranks by the model's plan."""

    name = "tp"

    def wrap_model(self, model: torch.nn.Module, evaluation_mode: bool) -> torch.nn.Module:
        """Apply the tensor parallel plan and record which parameters were replaced."""
        before = named_parameters(model)
        model = maybe_apply_tensor_parallel(self.context, model)
        self.remap.record(before, named_parameters(model))
        return model
