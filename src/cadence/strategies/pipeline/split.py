"""Cutting a model into pipeline stages.

A model is first read as an ordered chain of units, the pieces its forward runs one after the other:
the children of an `nn.Sequential`; for a transformers causal LM the embedding, each decoder layer,
the final norm and the head; for any other model its children in order, a `ModuleList`,
`ModuleDict` or `Sequential` child expanded into its items. Stages are contiguous runs of units, cut
where the user's split points say or balanced automatically.

A stage module keeps the units' original names (`layers.3.mlp.weight` stays `layers.3.mlp.weight`):
a checkpoint written stage by stage is one model's state dict, which loads on another split.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from ...core.input_errors import rank_prefix

_CONTAINERS = (torch.nn.ModuleList, torch.nn.ModuleDict, torch.nn.Sequential)


@dataclass(frozen=True)
class DecoderLayout:
    """Where a transformers causal LM keeps its parts (names relative to the whole model)."""

    embed: str
    layers: str
    norm: str
    head: str
    rotary: str | None


def decoder_layout(model: torch.nn.Module) -> DecoderLayout | None:
    """The layout of a transformers-style causal LM (`model.embed_tokens`, `model.layers`,
    `model.norm`, `lm_head`), or None when `model` is not one."""
    base = getattr(model, "model", None)
    if not isinstance(getattr(model, "lm_head", None), torch.nn.Module) or base is None:
        return None
    parts = ("embed_tokens", "layers", "norm")
    if not all(isinstance(getattr(base, p, None), torch.nn.Module) for p in parts):
        return None
    if not isinstance(base.layers, torch.nn.ModuleList):
        return None
    rotary = (
        "model.rotary_emb"
        if isinstance(getattr(base, "rotary_emb", None), torch.nn.Module)
        else None
    )
    return DecoderLayout("model.embed_tokens", "model.layers", "model.norm", "lm_head", rotary)


def chain_units(model: torch.nn.Module) -> list[str]:
    """The names of the units `model`'s forward runs in order (see the module's docstring)."""
    layout = decoder_layout(model)
    if layout is not None:
        layers = model.get_submodule(layout.layers)
        return (
            [layout.embed]
            + [f"{layout.layers}.{i}" for i in range(len(layers))]
            + [layout.norm, layout.head]
        )
    if isinstance(model, torch.nn.Sequential):
        return [name for name, _ in model.named_children()]
    units = []
    for name, child in model.named_children():
        if isinstance(child, _CONTAINERS):
            units.extend(f"{name}.{item}" for item, _ in child.named_children())
        else:
            units.append(name)
    return units


def partition(
    units: Sequence[str],
    stages: int,
    split_points: Sequence[str] | None,
    weights: Sequence[int] | None = None,
) -> list[list[str]]:
    """The units of each stage: cut before every split point, or balanced: the contiguous cut whose
    heaviest stage is lightest, by `weights` (parameter counts), else by count.

    Raises:
        ValueError: A split point that is not a unit, out of order, or leaving a stage empty; fewer
            units than stages.
    """
    units = list(units)
    if split_points is not None:
        starts = []
        for point in split_points:
            if point not in units:
                raise ValueError(
                    f"{rank_prefix()}split_points names {point!r}, which is not a unit of the model's "
                    f"chain; a stage can begin at one of: {', '.join(units[1:])}."
                )
            starts.append(units.index(point))
        if starts != sorted(starts) or (starts and starts[0] == 0):
            raise ValueError(
                f"{rank_prefix()}split_points {list(split_points)} must follow the model's order and "
                f"leave every stage at least one unit (the chain is {', '.join(units)})."
            )
        bounds = [0, *starts, len(units)]
        return [units[a:b] for a, b in zip(bounds, bounds[1:])]
    if len(units) < stages:
        raise ValueError(
            f"{rank_prefix()}The model has {len(units)} units ({', '.join(units)}) for {stages} "
            "pipeline stages: use fewer stages (pp_size x stages_per_process) or a deeper model."
        )
    if weights is None:
        weights = [1] * len(units)
    bounds = _lightest_cut(list(weights), stages)
    return [units[a:b] for a, b in zip(bounds, bounds[1:])]


def _lightest_cut(weights: list[int], stages: int) -> list[int]:
    """Stage boundaries [0, ..., len(weights)] of the contiguous cut into `stages` non-empty runs
    whose heaviest run is lightest, then whose runs are most even (dynamic programming over
    (heaviest run, sum of squared runs))."""
    count = len(weights)
    prefix = [0]
    for weight in weights:
        prefix.append(prefix[-1] + weight)
    worst = (float("inf"), float("inf"))
    # best[k][i]: the best (heaviest run, sum of squares) cutting the first i units into k runs;
    # cut[k][i]: where the last of those runs begins.
    best = [[worst] * (count + 1) for _ in range(stages + 1)]
    cut = [[0] * (count + 1) for _ in range(stages + 1)]
    best[0][0] = (0, 0)
    for k in range(1, stages + 1):
        for i in range(k, count - (stages - k) + 1):
            for start in range(k - 1, i):
                heaviest, squares = best[k - 1][start]
                run = prefix[i] - prefix[start]
                value = (max(heaviest, run), squares + run * run)
                if value < best[k][i]:
                    best[k][i], cut[k][i] = value, start
    bounds = [count]
    for k in range(stages, 0, -1):
        bounds.append(cut[k][bounds[-1]])
    return bounds[::-1]


def balanced_decoder_partition(
    model: torch.nn.Module, layout: DecoderLayout, stages: int
) -> list[list[str]]:
    """A causal LM's stages: its decoder layers balanced by count, the embedding on the first stage,
    the norm and head on the last."""
    count = len(model.get_submodule(layout.layers))
    if count < stages:
        raise ValueError(
            f"{rank_prefix()}The model has {count} decoder layers for {stages} pipeline stages: use "
            "fewer stages (pp_size x stages_per_process) or give split_points."
        )
    layers = partition([f"{layout.layers}.{i}" for i in range(count)], stages, None)
    layers[0].insert(0, layout.embed)
    layers[-1].extend([layout.norm, layout.head])
    return layers


def check_untied(model: torch.nn.Module, stage_units: Sequence[Sequence[str]]) -> None:
    """Refuse a parameter shared by two stages (tied embeddings): each stage's process updates its own
    copy, so the two would drift apart.

    Raises:
        ValueError: Naming the parameter in both stages.
    """
    owner: dict[int, tuple[int, str]] = {}
    for index, units in enumerate(stage_units):
        for unit in units:
            for name, param in model.get_submodule(unit).named_parameters(remove_duplicate=False):
                seen = owner.setdefault(id(param), (index, f"{unit}.{name}"))
                if seen[0] != index:
                    raise ValueError(
                        f"{rank_prefix()}The parameter {seen[1]} (stage {seen[0]}) is tied to "
                        f"{unit}.{name} (stage {index}): pipeline stages cannot share a weight. Untie "
                        "them (transformers: tie_word_embeddings=False) or split so both are in one stage."
                    )


def attach(root: torch.nn.Module, name: str, module: torch.nn.Module) -> None:
    """Register `module` under the dotted `name` in `root`, creating `ModuleDict` levels as needed,
    so the stage's parameter names are the model's."""
    *path, leaf = name.split(".")
    node = root
    for part in path:
        child = node._modules.get(part)
        if child is None:
            child = torch.nn.ModuleDict()
            node.add_module(part, child)
        node = child
    node.add_module(leaf, module)
