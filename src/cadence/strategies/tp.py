"""Tensor parallelism alone (ParallelismConfig(tp_size=N) over all N processes): each layer named in the
model's plan is split across ranks, and every rank sees the same batches. Composed with FSDP2 (2-D),
the FSDP strategy applies the same plan before sharding."""

from __future__ import annotations

import torch

from .mesh import maybe_apply_tensor_parallel
from .param_remap import named_parameters
from .sharded import ShardedStrategy


class TPStrategy(ShardedStrategy):
    name = "tp"

    def wrap_model(self, model: torch.nn.Module, evaluation_mode: bool) -> torch.nn.Module:
        before = named_parameters(model)
        model = maybe_apply_tensor_parallel(self.accelerator, model)
        self.remap.record(before, named_parameters(model))
        return model
