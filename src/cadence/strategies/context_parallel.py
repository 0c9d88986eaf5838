"""Context parallelism (`ParallelismConfig(cp_size > 1)`): the sequence split over the `cp` ranks.

Through torch's own `context_parallel`: inside `Accelerator.maybe_context_parallel(buffers=...)` the
buffers (inputs, labels, `position_ids`) are sharded on their sequence dimension, and every
`scaled_dot_product_attention` call becomes ring attention over the `cp` mesh dimension, with the
rotate method of `TorchContextParallelConfig.cp_comm_strategy`. FSDP2 shards the model over the
flattened `dp_shard_cp` dimension (strategies/mesh.py), so the cp ranks share its parameter memory too.

Ring attention computes causal attention only. At `prepare`, the model's self-attention modules get a
pre-hook that turns a causal `attention_mask` into `is_causal=True`; a mask that is not causal (padding,
sliding window) cannot be kept and is refused, as are models whose configuration has sliding-window or
chunked attention layers. `CADENCE_CP_DROP_ATTENTION_MASK=1` drops any mask instead, as Accelerate does.
A model whose forward takes `position_ids` must be given them as a buffer: positions computed from the
local shard would be those of the first tokens of the sequence. Labels that a model shifts itself
(transformers' `labels`) must come with `shift_labels`, shifted before the split.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
from collections.abc import Iterator
from typing import Any

import torch

from ..core.input_errors import rank_prefix
from ..core.settings import resolve_flag
from ..runtime.logging import get_logger
from .context import StrategyContext

logger = get_logger(__name__)

_NOT_ENABLED = (
    "Context parallel training is not enabled. This context manager will have no effect. "
    "To enable it, set `parallelism_config.cp_size` > 1 in the `Accelerator` constructor."
)


@contextlib.contextmanager
def context_parallel_not_enabled() -> Iterator[None]:
    """The no-op of `maybe_context_parallel` without context parallelism: it warns once."""
    logger.warning_once(_NOT_ENABLED)
    yield


# Configuration fields of transformers models whose attention layers a dropped mask would change.
_WINDOWED_LAYER_TYPES = ("sliding_attention", "chunked_attention")


def windowed_attention(model: torch.nn.Module) -> str | None:
    """What makes `model` use sliding-window or chunked attention (None when it does not)."""
    config = getattr(model, "config", None)
    if config is None:
        return None
    layer_types = getattr(config, "layer_types", None) or ()
    windowed = sorted({t for t in layer_types if t in _WINDOWED_LAYER_TYPES})
    if windowed:
        return f"config.layer_types has {', '.join(windowed)} layers"
    if getattr(config, "attention_chunk_size", None):
        return f"config.attention_chunk_size={config.attention_chunk_size}"
    window = getattr(config, "sliding_window", None)
    if window and getattr(config, "use_sliding_window", True):
        return f"config.sliding_window={window}"
    return None


def _is_causal_mask(mask: torch.Tensor) -> bool:
    """Whether `mask` (bool: True attends; float: 0 attends) is the plain causal mask, or all-attend 2D."""
    if mask.dim() == 2:  # a (batch, sequence) padding mask: harmless only when nothing is padded
        return bool((mask != 0).all()) if mask.dtype != torch.bool else bool(mask.all())
    if mask.dim() != 4 or mask.shape[-1] != mask.shape[-2]:
        return False
    length = mask.shape[-1]
    causal = torch.ones(length, length, dtype=torch.bool, device=mask.device).tril()
    attends = mask if mask.dtype == torch.bool else mask == 0
    return bool((attends == causal).all())


class ContextParallel:
    """The context parallelism of one training: its `cp` mesh, rotate method, hooks and context.

    Built by the FSDP2 (or, with `ACCELERATE_ALLOW_CP_STANDALONE=true`, the DDP) strategy when
    `cp_size > 1`; `maybe_context_parallel` of the Accelerator enters `context(...)`.
    """

    def __init__(self, config: Any, device: torch.device) -> None:
        self.config = config
        self.device = device
        self.rotate_method = config.cp_handler.cp_comm_strategy
        # Accelerate's behaviour: every mask the hook sees is dropped (docs/differences.md).
        self.drop_any_mask = resolve_flag("cp_drop_attention_mask", launch={}).value
        if device.type == "cpu":
            from .cp_cpu_attention import (
                register_cpu_ring_attention,  # deferred: private torch modules, loaded for CP on CPU
            )

            register_cpu_ring_attention()
        self._mesh: Any = None
        self._active_buffers: list[torch.Tensor] | None = None

    @classmethod
    def of(cls, context: StrategyContext) -> ContextParallel | None:
        """The context parallelism asked for in `context` (None when cp_size is 1)."""
        config = context.parallelism_config
        if config is None or not config.cp_enabled:
            return None
        return cls(config, context.device)

    @property
    def mesh(self) -> Any:
        """The `cp` dimension of the ParallelismConfig's device mesh."""
        if self._mesh is None:
            self._mesh = self.config.get_device_mesh(self.device.type)["cp"]
        return self._mesh

    @property
    def size(self) -> int:
        """The number of ranks a sequence is split over."""
        return self.config.cp_size

    # -- prepare ------------------------------------------------------------------------------------
    def check_model(self, model: torch.nn.Module) -> None:
        """Refuse a model whose attention CP cannot compute exactly (before any collective)."""
        windowed = windowed_attention(model)
        if windowed is not None:
            raise ValueError(
                f"{rank_prefix()}Context parallelism cannot train {type(model).__name__}: "
                f"{windowed}. Ring attention computes full causal attention only, so the window "
                "would be dropped silently. Use a model without sliding-window or chunked attention, "
                "or cp_size=1."
            )

    def attach(self, model: torch.nn.Module) -> None:
        """Hook the self-attention modules (mask -> is_causal) and the model (position_ids check)."""
        for name, module in model.named_modules():
            if name.endswith("self_attn") and not getattr(module, "_cadence_cp_hooked", False):
                # Prepended, so that no other hook sees the mask first.
                module.register_forward_pre_hook(
                    self._attention_hook, with_kwargs=True, prepend=True
                )
                module._cadence_cp_hooked = True
        try:
            signature = inspect.signature(model.forward)
        except (TypeError, ValueError):
            return
        watched = {"position_ids", "labels"} & set(signature.parameters)
        if watched and not getattr(model, "_cadence_cp_hooked", False):
            hook = functools.partial(self._inputs_hook, signature=signature)
            model.register_forward_pre_hook(hook, with_kwargs=True)
            model._cadence_cp_hooked = True

    def _attention_hook(self, module: Any, args: Any, kwargs: dict[str, Any]) -> Any:
        if "attention_mask" not in kwargs:
            return args, kwargs
        mask = kwargs["attention_mask"]
        if mask is not None and not self.drop_any_mask and not _is_causal_mask(mask):
            raise ValueError(
                f"{rank_prefix()}Context parallelism got an attention mask that is not causal "
                f"(shape {tuple(mask.shape)}): ring attention can only compute causal attention, so "
                "the mask would be dropped. Train on unpadded (packed) sequences without a mask, or set "
                "CADENCE_CP_DROP_ATTENTION_MASK=1 to drop it as Accelerate does."
            )
        kwargs["attention_mask"] = None
        kwargs["is_causal"] = True
        return args, kwargs

    def _inputs_hook(
        self, module: Any, args: Any, kwargs: dict[str, Any], signature: inspect.Signature
    ) -> Any:
        """Inside the context: position_ids (and shift_labels) must be buffers, and labels that the
        model would shift itself (across the shards' boundaries) come with shift_labels."""
        buffers = self._active_buffers
        if buffers is None:
            return args, kwargs
        try:
            bound = signature.bind_partial(*args, **kwargs).arguments
        except TypeError:  # the forward itself will say what is wrong with the call
            return args, kwargs
        extra = next(
            (
                bound.get(p.name) or {}
                for p in signature.parameters.values()
                if p.kind is p.VAR_KEYWORD
            ),
            {},
        )
        name = type(module).__name__

        def is_buffer(value: Any) -> bool:
            return any(value is b for b in buffers)

        positions = bound.get("position_ids")
        if "position_ids" in signature.parameters and (
            positions is None or not is_buffer(positions)
        ):
            raise ValueError(
                f"{rank_prefix()}Under context parallelism {name} needs position_ids passed as a "
                "buffer: maybe_context_parallel(buffers=[..., position_ids], buffer_seq_dims=[..., 1]) "
                "and model(..., position_ids=position_ids). Without it every rank numbers its shard "
                "of the sequence from 0."
            )
        shifted = extra.get("shift_labels", bound.get("shift_labels"))
        if bound.get("labels") is not None and (shifted is None or not is_buffer(shifted)):
            raise ValueError(
                f"{rank_prefix()}Under context parallelism {name} got labels without shift_labels "
                "among the buffers: the model would shift the labels of each shard on its own, and "
                "every shard's last token would get the wrong target. Shift the labels before the "
                "split and pass them as a buffer and as model(..., shift_labels=...)."
            )
        return args, kwargs

    # -- each step ----------------------------------------------------------------------------------
    def _check_buffers(
        self, buffers: list[torch.Tensor], buffer_seq_dims: list[int], no_restore: set
    ) -> None:
        if not buffers:
            raise ValueError(
                f"{rank_prefix()}maybe_context_parallel needs buffers: the tensors to split on the "
                "sequence dimension (input_ids, shifted labels, position_ids), with buffer_seq_dims."
            )
        if len(buffers) != len(buffer_seq_dims):
            raise ValueError(
                f"{rank_prefix()}maybe_context_parallel got {len(buffers)} buffers but "
                f"{len(buffer_seq_dims)} buffer_seq_dims: give one sequence dimension per buffer."
            )
        lengths = {int(b.shape[d]) for b, d in zip(buffers, buffer_seq_dims)}
        if len(lengths) != 1:
            raise ValueError(
                f"{rank_prefix()}The buffers of maybe_context_parallel have different sequence "
                f"lengths {sorted(lengths)}: each must be split along the same sequence."
            )
        length = lengths.pop()
        if length % self.size:
            raise ValueError(
                f"{rank_prefix()}The sequence length {length} is not divisible by cp_size={self.size}: "
                f"pad the batch to a multiple of {self.size} (of {2 * self.size} for load-balanced "
                "causal attention; pad labels with -100)."
            )
        # The buffers are cut down in place one after the other: two that share memory (views of one
        # tensor, like input_ids and labels sliced from one row of tokens) would overwrite each other.
        owners: dict[int, int] = {}
        for index, buffer in enumerate(buffers):
            storage = buffer.untyped_storage().data_ptr()
            if storage in owners:
                raise ValueError(
                    f"{rank_prefix()}Buffers {owners[storage]} and {index} of maybe_context_parallel "
                    "share memory (views of one tensor): splitting one in place would overwrite the "
                    "other. Pass separate tensors, e.g. labels.clone()."
                )
            owners[storage] = index
        for buffer in no_restore:
            if not any(buffer is b for b in buffers):
                raise ValueError(
                    f"{rank_prefix()}no_restore_buffers must be a subset of buffers (the same tensors)."
                )

    @contextlib.contextmanager
    def context(
        self,
        buffers: list[torch.Tensor] | None,
        buffer_seq_dims: list[int] | None,
        no_restore_buffers: set[torch.Tensor] | None,
    ) -> Iterator[None]:
        """Shard `buffers` on their sequence dimension and run attention as ring attention inside."""
        from torch.distributed.tensor.experimental import context_parallel
        from torch.distributed.tensor.experimental._attention import set_rotate_method

        buffers = list(buffers or [])
        seq_dims = list(buffer_seq_dims or [])
        no_restore = set(no_restore_buffers or ())
        self._check_buffers(buffers, seq_dims, no_restore)
        # torch keeps the rotate method in a module global: set it at every entry, so that another
        # Accelerator's (or the user's) choice does not leak in.
        set_rotate_method(self.rotate_method)
        with context_parallel(
            self.mesh, buffers=buffers, buffer_seq_dims=seq_dims, no_restore_buffers=no_restore
        ):
            self._active_buffers = buffers
            try:
                yield
            finally:
                self._active_buffers = None
