"""torchao FP8 helpers: layer selection is real; converting a model needs torchao."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ..availability import is_torchao_available


def find_first_last_linear_layers(model: torch.nn.Module) -> tuple[str | None, str | None]:
    """Qualified names of the first and last `nn.Linear` of `model` (kept in high precision for
    stability), `(None, None)` without one.

    Example:
        >>> find_first_last_linear_layers(torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.ReLU(), torch.nn.Linear(2, 2)))
        ('0', '2')
    """
    names = [name for name, module in model.named_modules() if isinstance(module, torch.nn.Linear)]
    return (names[0], names[-1]) if names else (None, None)


def filter_linear_layers(module: torch.nn.Module, fqn: str, layers_to_filter: list[str]) -> bool:
    """Whether the layer `fqn` may be converted to FP8: not named in `layers_to_filter`, and, for a
    Linear, with both dimensions multiples of 16 (what FP8 matmuls need)."""
    if isinstance(module, torch.nn.Linear) and (
        module.in_features % 16 or module.out_features % 16
    ):
        return False
    return fqn not in layers_to_filter


def filter_first_and_last_linear_layers(module: torch.nn.Module, fqn: str) -> bool:
    """`filter_linear_layers` that keeps the first and last Linear of `module` out of FP8."""
    first, last = find_first_last_linear_layers(module)
    return filter_linear_layers(module, fqn, layers_to_filter=[first, last])


def has_ao_layers(model: torch.nn.Module) -> bool:
    """Whether `model` holds torchao Float8 linear layers."""
    return any(type(m).__name__ == "Float8Linear" for m in model.modules())


def convert_model_to_fp8_ao(
    model: torch.nn.Module,
    config: Any = None,
    module_filter_func: Callable[[torch.nn.Module, str], bool] | None = None,
) -> None:
    """Convert `model`'s linear layers to torchao Float8 in place (needs torchao)."""

    if not is_torchao_available():
        raise ImportError(
            "convert_model_to_fp8_ao needs torchao 0.6.1 or newer: `pip install torchao`."
        )
    from torchao.float8 import convert_to_float8_training  # optional dependency

    first_last = list(find_first_last_linear_layers(model))

    def default_filter(module: torch.nn.Module, fqn: str) -> bool:
        return filter_linear_layers(module, fqn, first_last)

    convert_to_float8_training(
        model, config=config, module_filter_fn=module_filter_func or default_filter
    )


__all__ = [
    "convert_model_to_fp8_ao",
    "filter_first_and_last_linear_layers",
    "filter_linear_layers",
    "find_first_last_linear_layers",
    "has_ao_layers",
]
