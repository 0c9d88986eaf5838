"""The strategy interface, and its single-process implementation (no wrapping, no communication).

A strategy owns one backend's behaviour: how a model is wrapped and unwrapped, how backward runs (through
the precision it owns), how gradients are clipped, and how its state is saved. It is built once by
`select_strategy` from a `StrategyContext`, its `Precision` and the `PreparedObjects` registry.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import torch

from ..core.prepared import PreparedObjects
from ..precision.policy import Precision
from .context import StrategyContext

if TYPE_CHECKING:
    from .context_parallel import ContextParallel


class Strategy:
    """Single process: the model is used as it is."""

    name = "single"

    def __init__(
        self, context: StrategyContext, precision: Precision, prepared: PreparedObjects
    ) -> None:
        self.context = context
        self.precision = precision
        self.prepared = prepared
        self.context_parallel: ContextParallel | None = None
        config = context.parallelism_config
        if config is not None and config.cp_enabled:
            if not self.runs_context_parallel:
                raise ValueError(
                    f"cp_size={config.cp_size} (context parallelism) cannot run with the {self.name} "
                    "strategy: use FSDP2 (fsdp_plugin=FullyShardedDataParallelPlugin(fsdp_version=2))."
                )
            from .context_parallel import ContextParallel  # deferred: only with cp_size > 1

            self.context_parallel = ContextParallel.of(context)

    # Whether this backend runs context parallelism (cp_size > 1): FSDP2, and DDP when allowed.
    runs_context_parallel = False

    def place_model(self, model: torch.nn.Module) -> torch.nn.Module:
        """Move `model` to this process's device (before it is wrapped); returns it."""
        return model.to(self.context.device)

    def wrap_data_loader(self, loader: Any) -> Any:
        """The prepared dataloader as the training loop reads it (unchanged here)."""
        return loader

    def wrap_model(self, model: torch.nn.Module, evaluation_mode: bool) -> torch.nn.Module:
        """Return the model to train with; the single-process strategy returns it unchanged."""
        return model

    def unwrap(self, model: torch.nn.Module) -> torch.nn.Module:
        """Remove this strategy's wrapper from `model` (none here: returns it as is)."""
        return model

    def is_wrapped(self, model: Any) -> bool:
        """Whether `model` carries this strategy's wrapper (never, here)."""
        return False

    def unwrap_fully(self, model: torch.nn.Module) -> tuple[torch.nn.Module, Any]:
        """(the user's module, the outermost torch.compile wrapper or None): strips compile and wrappers."""
        compiled = None
        inner = model
        while True:
            if hasattr(inner, "_orig_mod"):
                compiled = compiled or inner
                inner = inner._orig_mod
            elif self.is_wrapped(inner):
                inner = self.unwrap(inner)
            elif isinstance(inner, torch.nn.DataParallel):
                inner = inner.module
            else:
                return inner, compiled

    def prepare_context_parallel(self, model: torch.nn.Module) -> None:
        """Check `model` for context parallelism and hook its attention (no-op when cp_size is 1)."""
        if self.context_parallel is not None:
            self.context_parallel.check_model(model)
            self.context_parallel.attach(model)

    def maybe_context_parallel(
        self,
        buffers: list[torch.Tensor] | None = None,
        buffer_seq_dims: list[int] | None = None,
        no_restore_buffers: set[torch.Tensor] | None = None,
    ) -> contextlib.AbstractContextManager:
        """The context of one context-parallel step; without context parallelism, a no-op that warns
        once."""
        if self.context_parallel is None:
            from .context_parallel import context_parallel_not_enabled  # deferred: when asked for

            return context_parallel_not_enabled()
        return self.context_parallel.context(buffers, buffer_seq_dims, no_restore_buffers)

    def no_sync(self, model: Any) -> contextlib.AbstractContextManager:
        """Context in which backward skips the gradient sync (a no-op here)."""
        return contextlib.nullcontext()

    def trigger_sync_in_backward(self, model: Any) -> contextlib.AbstractContextManager:
        """Context forcing the next backward to sync gradients (a no-op here)."""
        return contextlib.nullcontext()

    def backward(self, loss: torch.Tensor, **kwargs: Any) -> None:
        """Scale the loss as the precision says, then back-propagate."""
        self.precision.scale_loss(loss).backward(**kwargs)

    def clip_grad_norm_(
        self, parameters: Iterable[torch.Tensor], max_norm: float, norm_type: float
    ) -> torch.Tensor:
        """Clip the gradients' total norm to `max_norm`; returns the norm before clipping."""
        return torch.nn.utils.clip_grad_norm_(parameters, max_norm, norm_type=norm_type)

    def clip_grad_value_(self, parameters: Iterable[torch.Tensor], clip_value: float) -> None:
        """Clamp every gradient element to [-clip_value, clip_value]."""
        torch.nn.utils.clip_grad_value_(parameters, clip_value)

    # -- hooks of the sharded and engine backends (FSDP, tensor parallel, DeepSpeed) -----------------
    # Whether Accelerator.backward divides the loss by the accumulation steps (DeepSpeed's engine does).
    divides_loss_for_accumulation = True
    # Whether models and optimizers are checkpointed by save_sharded_state / load_sharded_state.
    saves_sharded_state = False
    # Its sharded checkpoints load on another number of processes (torch.distributed.checkpoint).
    reshards_on_load: bool = True

    @property
    def scheduler_processes(self) -> int:
        """How many steps a prepared scheduler advances per optimizer step without split_batches: the
        processes (Accelerate's rule; the pipeline strategy counts its data-parallel replicas)."""
        return self.context.num_processes

    def prepare_group(
        self, objects: list[Any], kinds: list[str], placements: list[Any], prepare_one: Any
    ) -> list[Any] | None:
        """Prepare all objects of one prepare() call together (an engine); None: one by one as usual.

        `prepare_one(obj, kind, placement)` prepares one object the usual way (e.g. a dataloader)."""
        return None

    def adopt_optimizer(self, optimizer: torch.optim.Optimizer) -> None:
        """Point an optimizer built before prepare() at the parameters that sharding put in the model."""

    def state_dict(self, model: torch.nn.Module, unwrap: bool = True) -> dict[str, Any]:
        """The model's whole state dict (on sharded backends: complete on the main process, on CPU)."""
        return (self.unwrap_fully(model)[0] if unwrap else model).state_dict()

    def save_sharded_state(
        self, directory: Any, models: list[Any], optimizers: list[Any]
    ) -> list[str]:
        """Write sharded model/optimizer state; unsharded backends raise NotImplementedError."""
        raise NotImplementedError(f"The {self.name} strategy saves models with the regular files.")

    def load_sharded_state(
        self, directory: Any, models: list[Any], optimizers: list[Any], open_file: Any = None
    ) -> None:
        """Read sharded model/optimizer state; unsharded backends raise NotImplementedError.

        `open_file(name)`, when given, returns a file object of checkpoint file `name`'s verified
        content (the checkpoint reader's): a strategy that reads files itself reads them through it.
        """
        raise NotImplementedError(f"The {self.name} strategy loads models from the regular files.")
