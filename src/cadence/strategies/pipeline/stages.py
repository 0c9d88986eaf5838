"""The modules a pipeline stage runs: a run of the model's units under their original names.

`ChainStage` feeds each unit's output to the next (an `nn.Sequential`, or a model whose forward is
its children in order). `DecoderStage` runs a piece of a transformers causal LM: the embedding on the
first stage, its decoder layers with the rotary position embeddings and the causal mask each stage
computes itself (they carry no weights, so only the hidden states travel between stages), and the
norm and head on the last stage.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from .split import DecoderLayout, attach


def _units_of(model: torch.nn.Module, names: Sequence[str]) -> list[tuple[str, torch.nn.Module]]:
    return [(name, model.get_submodule(name)) for name in names]


class ChainStage(torch.nn.Module):
    """Units run one after the other: `x -> unit_1(x) -> unit_2(...) ...` (a tuple output is passed
    on as the next unit's positional arguments)."""

    def __init__(self, model: torch.nn.Module, names: Sequence[str]) -> None:
        super().__init__()
        self._unit_names = list(names)
        for name, module in _units_of(model, names):
            attach(self, name, module)

    def forward(self, *args: Any) -> Any:
        """Run the stage's units on the previous stage's output (or the batch's inputs)."""
        value: Any = args
        for name in self._unit_names:
            unit = self.get_submodule(name)
            value = unit(*value) if isinstance(value, tuple) else unit(value)
        return value


def causal_mask(length: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """The additive causal mask (1, 1, length, length) both eager and sdpa attention accept."""
    blocked = torch.ones(length, length, dtype=torch.bool, device=device).triu(1)
    mask = torch.zeros(length, length, dtype=dtype, device=device)
    return mask.masked_fill(blocked, torch.finfo(dtype).min)[None, None]


class DecoderStage(torch.nn.Module):
    """A piece of a transformers causal LM (see the module's docstring): input ids or hidden states
    in, hidden states or logits out."""

    def __init__(self, model: torch.nn.Module, names: Sequence[str], layout: DecoderLayout) -> None:
        super().__init__()
        self._unit_names = list(names)
        self._layout = layout
        self._layer_names = [n for n in names if n.startswith(layout.layers + ".")]
        for name, module in _units_of(model, names):
            attach(self, name, module)
        # The rotary embedding holds only non-persistent buffers: each stage with layers uses it,
        # kept out of the module tree so it neither appears in state dicts nor gets sharded.
        self._rotary = (
            [model.get_submodule(layout.rotary)] if layout.rotary and self._layer_names else []
        )

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """Embed (first stage), run the decoder layers, normalise and project (last stage)."""
        layout = self._layout
        if layout.embed in self._unit_names:
            hidden = self.get_submodule(layout.embed)(hidden)
        if self._layer_names:
            length = hidden.shape[1]
            positions = torch.arange(length, device=hidden.device)[None]
            extra: dict[str, Any] = {"position_ids": positions}
            if self._rotary:
                rotary = self._rotary[0].to(hidden.device)
                extra["position_embeddings"] = rotary(hidden, positions)
            mask = causal_mask(length, hidden.dtype, hidden.device)
            for name in self._layer_names:
                out = self.get_submodule(name)(
                    hidden, attention_mask=mask, use_cache=False, **extra
                )
                hidden = out[0] if isinstance(out, tuple) else out
        if layout.norm in self._unit_names:
            hidden = self.get_submodule(layout.norm)(hidden)
        if layout.head in self._unit_names:
            hidden = self.get_submodule(layout.head)(hidden)
        return hidden


def causal_lm_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Next-token cross-entropy, mean over the labels that are not -100 (transformers' causal LM loss)."""
    shifted = logits[:, :-1].float().reshape(-1, logits.shape[-1])
    targets = labels[:, 1:].reshape(-1).to(logits.device)
    return torch.nn.functional.cross_entropy(shifted, targets, ignore_index=-100)


def build_stage(
    model: torch.nn.Module, names: Sequence[str], layout: DecoderLayout | None
) -> torch.nn.Module:
    """The stage module running the units `names` of `model`."""
    if layout is not None:
        return DecoderStage(model, names, layout)
    return ChainStage(model, names)


def local_part(model: torch.nn.Module, stage_names: Sequence[Sequence[str]]) -> torch.nn.Module:
    """One module holding every unit of this process's stages under their original names: what its
    state dict, checkpoints and optimizer see."""
    part = torch.nn.Module()
    for names in stage_names:
        for name, module in _units_of(model, names):
            attach(part, name, module)
    return part
