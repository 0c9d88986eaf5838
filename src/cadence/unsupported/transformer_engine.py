"""NVIDIA Transformer Engine names: layer checks answer for real; converting a model raises."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from . import unsupported

FEATURE = "the Transformer Engine FP8 integration"
INSTEAD = "Use `mixed_precision='bf16'`, or FP8 through torchao (`AORecipeKwargs`) where available."


def has_transformer_engine_layers(model: torch.nn.Module) -> bool:
    """Whether `model` contains Transformer Engine layers (te.Linear, te.LayerNorm, ...).

    Args:
        model (torch.nn.Module): The model to inspect.

    Returns:
        bool: True when some module comes from Transformer Engine.
    """
    return any(type(m).__module__.startswith("transformer_engine") for m in model.modules())


def convert_model(
    model: torch.nn.Module,
    to_transformer_engine: bool = True,
    _convert_linear: bool = True,
    _convert_ln: bool = True,
) -> None:
    """Swap linear/LayerNorm layers for Transformer Engine ones and back (unsupported).

    Args:
        model (torch.nn.Module): The model, converted in place.
        to_transformer_engine (bool): Convert to Transformer Engine layers (default True), or back.

    Raises:
        UnsupportedFeatureError: Always (a `NotImplementedError`): Transformer Engine is not supported.
    """
    unsupported("convert_model", FEATURE, INSTEAD)


def apply_fp8_autowrap(model: torch.nn.Module, fp8_recipe_handler: Any) -> torch.nn.Module:
    """Run a model's forward under Transformer Engine's FP8 autocast (unsupported).

    Args:
        model (torch.nn.Module): The model.
        fp8_recipe_handler (Any): The FP8 recipe settings.

    Raises:
        UnsupportedFeatureError: Always (a `NotImplementedError`): Transformer Engine is not supported.
    """
    return unsupported("apply_fp8_autowrap", FEATURE, INSTEAD)


def contextual_fp8_autocast(
    model_forward: Callable[..., Any], fp8_recipe: Any, use_during_eval: bool = False
) -> Callable[..., Any]:
    """Wrap a forward in Transformer Engine's FP8 autocast (unsupported).

    Args:
        model_forward (Callable[..., Any]): The forward to wrap.
        fp8_recipe (Any): Transformer Engine's FP8 recipe.
        use_during_eval (bool): Keep FP8 in evaluation mode too (default False).

    Raises:
        UnsupportedFeatureError: Always (a `NotImplementedError`): Transformer Engine is not supported.
    """
    return unsupported("contextual_fp8_autocast", FEATURE, INSTEAD)
