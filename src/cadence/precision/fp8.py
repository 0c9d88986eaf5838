"""FP8 training: the model's linear layers compute in float8, everything else under bf16 autocast.

Two backends, chosen once by `choice.choose_precision` (its `fp8_backend`) and applied by the policy that
`cadence.strategies.select_precision` builds:

- torchao ("AO"): `nn.Linear` layers become `torchao.float8.Float8Linear` (dynamic scaling) with the
  recipe of `AORecipeKwargs.config` (a `Float8LinearConfig`). The first and last linear layers and those
  whose dimensions are not multiples of 16 stay in high precision unless `module_filter_func` says
  otherwise (fp8 at the edges of a network hurts convergence; `torch._scaled_mm` needs multiples of 16).
  With FSDP2 and `enable_fsdp_float8_all_gather`, the float8 scales are recomputed after every optimizer
  step for all parameters at once (`precompute_float8_dynamic_scale_for_fsdp`).
- Transformer Engine ("TE"): `nn.Linear` / `nn.LayerNorm` become their `transformer_engine.pytorch`
  counterparts and the forward runs under `te.fp8_autocast` with the recipe of `TERecipeKwargs`.

Both keep fp32 master weights and hand back fp32 outputs, as the bf16 policy does.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch

from ..options.dataclasses import AORecipeKwargs, TERecipeKwargs
from .choice import PrecisionChoice, fp8_handler_backend
from .policy import AutocastPrecision


def find_first_last_linear_layers(model: torch.nn.Module) -> tuple[str | None, str | None]:
    """The qualified names of the first and last `nn.Linear` of `model` (None when it has none).

    Example::

        first, last = find_first_last_linear_layers(model)   # ("embed_proj", "lm_head")

    Args:
        model (torch.nn.Module): The model to search.

    Returns:
        tuple[str | None, str | None]: The first and the last linear's names.
    """
    first = last = None
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.Linear):
            first = name if first is None else first
            last = name
    return first, last


def filter_linear_layers(module: torch.nn.Module, fqn: str, layers_to_filter: list[str]) -> bool:
    """Whether to convert `module` (named `fqn`) to float8: a linear whose dimensions are multiples of 16
    and whose name is not in `layers_to_filter`.

    Args:
        module (torch.nn.Module): The module torchao asks about.
        fqn (str): Its full name.
        layers_to_filter (list[str]): Full names of modules to keep in high precision.

    Returns:
        bool: Whether to convert it.
    """
    if isinstance(module, torch.nn.Linear) and (
        module.in_features % 16 != 0 or module.out_features % 16 != 0
    ):
        return False
    return fqn not in layers_to_filter


def filter_first_and_last_linear_layers(module: torch.nn.Module, fqn: str) -> bool:
    """A `module_filter_func` keeping the first and last linear layers of `module` in high precision.

    Args:
        module (torch.nn.Module): The module torchao asks about.
        fqn (str): Its full name.

    Returns:
        bool: Whether to convert it.
    """
    first, last = find_first_last_linear_layers(module)
    return filter_linear_layers(module, fqn, layers_to_filter=[first, last])


def convert_model_to_fp8_ao(
    model: torch.nn.Module, config: Any = None, module_filter_func: Callable | None = None
) -> torch.nn.Module:
    """Swap the linears of `model` for torchao `Float8Linear` in place (not the first and last by default).

    Example::

        from torchao.float8 import Float8LinearConfig

        convert_model_to_fp8_ao(model, Float8LinearConfig(pad_inner_dim=True))

    Args:
        model (torch.nn.Module): The model to convert.
        config (Any): A torchao `Float8LinearConfig`; None uses torchao's default.
        module_filter_func (Callable | None): Called as `f(module, fqn)`, True for the modules to convert;
            None converts every linear with dimensions divisible by 16 except the first and last.

    Returns:
        torch.nn.Module: `model`.
    """
    from torchao.float8 import convert_to_float8_training  # optional dependency

    if module_filter_func is None:
        first, last = find_first_last_linear_layers(model)
        module_filter_func = functools.partial(filter_linear_layers, layers_to_filter=[first, last])
    convert_to_float8_training(model, module_filter_fn=module_filter_func, config=config)
    return model


def has_ao_layers(model: torch.nn.Module) -> bool:
    """Whether `model` holds at least one torchao `Float8Linear`.

    Args:
        model (torch.nn.Module): The model to inspect.

    Returns:
        bool: True when torchao has converted some layer.
    """
    from torchao.float8.float8_linear import Float8Linear  # optional dependency

    return any(isinstance(module, Float8Linear) for module in model.modules())


def convert_model_to_te(model: torch.nn.Module) -> torch.nn.Module:
    """Swap `nn.Linear` (dimensions multiple of 16) and `nn.LayerNorm` for Transformer Engine's, in place,
    copying their weights."""
    import transformer_engine.pytorch as te  # optional dependency

    for name, child in list(model.named_children()):
        if isinstance(child, torch.nn.Linear):
            if child.in_features % 16 or child.out_features % 16:
                continue  # fp8 GEMMs need multiples of 16: this one stays as it is
            replacement = te.Linear(
                child.in_features,
                child.out_features,
                bias=child.bias is not None,
                params_dtype=child.weight.dtype,
                device=child.weight.device,
            )
        elif isinstance(child, torch.nn.LayerNorm) and len(child.normalized_shape) == 1:
            replacement = te.LayerNorm(
                child.normalized_shape[0],
                eps=child.eps,
                params_dtype=child.weight.dtype,
                device=child.weight.device,
            )
        else:
            convert_model_to_te(child)
            continue
        with torch.no_grad():
            replacement.weight.copy_(child.weight)
            if getattr(child, "bias", None) is not None:
                replacement.bias.copy_(child.bias)
        setattr(model, name, replacement)
    return model


def te_recipe(handler: Any) -> Any:
    """The Transformer Engine recipe of a `TERecipeKwargs` (defaults: HYBRID delayed scaling)."""
    from transformer_engine.common import recipe  # optional dependency

    kwargs = handler.to_kwargs() if handler is not None else {}
    kwargs.pop("use_autocast_during_eval", None)
    for name in (
        "backend",
        "opt_level",
    ):  # fields of the deprecated FP8RecipeKwargs, not of the recipe
        kwargs.pop(name, None)
    block_scaling = kwargs.pop("use_mxfp8_block_scaling", False)
    if "fp8_format" in kwargs:
        kwargs["fp8_format"] = getattr(recipe.Format, kwargs["fp8_format"])
    if block_scaling:
        for name in ("amax_compute_algo", "amax_history_len"):
            if name in kwargs:
                raise ValueError(
                    f"TERecipeKwargs({name}=...) does not apply to MXFP8 block scaling."
                )
        return recipe.MXFP8BlockScaling(**kwargs)
    return recipe.DelayedScaling(**kwargs)


class Float8Precision(AutocastPrecision):
    """fp8: linear layers converted to float8 (torchao or Transformer Engine), bf16 autocast around the
    forward, fp32 outputs. No loss scaling: float8 training scales tensors itself."""

    def __init__(
        self,
        backend: str,
        device_type: str,
        recipe_handler: Any = None,
        autocast_kwargs: dict[str, Any] | None = None,
        fsdp2: bool = False,
    ) -> None:
        super().__init__("fp8", device_type, autocast_kwargs, scaler=None)
        self.backend = backend
        self.recipe_handler = recipe_handler
        self.fsdp2 = fsdp2

    @classmethod
    def build_fp8(
        cls, choice: PrecisionChoice, device: torch.device, fsdp2: bool = False
    ) -> Float8Precision:
        """The policy for `choice` (its `fp8_backend`, and the recipe of its `fp8_handler` or the
        backend's default recipe) on `device`."""
        backend = choice.fp8_backend
        if backend is None:
            raise ValueError(
                "Float8Precision needs the FP8 backend of the choice: build it with "
                "cadence.precision.choice.choose_precision('fp8', ...)."
            )
        handler = choice.fp8_handler
        if handler is None or fp8_handler_backend(handler) is None:
            handler = _default_handler(backend)
        autocast = choice.autocast_handler.to_kwargs() if choice.autocast_handler else {}
        return cls(backend, device.type, handler, autocast, fsdp2=fsdp2)

    @property
    def fp8_backend(self) -> str:
        """ "AO" (torchao) or "TE" (Transformer Engine)."""
        return self.backend

    def convert_model(self, model: torch.nn.Module) -> torch.nn.Module:
        """Swap the model's linear layers for float8 ones (once)."""
        if getattr(model, "_cadence_fp8_converted", False):
            return model
        if self.backend == "AO":
            convert_model_to_fp8_ao(
                model,
                config=getattr(self.recipe_handler, "config", None),
                module_filter_func=getattr(self.recipe_handler, "module_filter_func", None),
            )
        else:
            convert_model_to_te(model)
        model._cadence_fp8_converted = True  # type: ignore[attr-defined]
        return model

    def attach_optimizer(self, optimizer: torch.optim.Optimizer, models: list[Any]) -> None:
        """With FSDP2 and float8 all-gather, recompute every parameter's float8 scale after each step
        in one pass (instead of one reduction per parameter in the next forward)."""
        config = getattr(self.recipe_handler, "config", None)
        if not (self.backend == "AO" and self.fsdp2 and models):
            return
        if not getattr(config, "enable_fsdp_float8_all_gather", False):
            return
        from torchao.float8 import precompute_float8_dynamic_scale_for_fsdp  # optional dependency

        model = models[0]
        optimizer.register_step_post_hook(
            lambda *args, **kwargs: precompute_float8_dynamic_scale_for_fsdp(model)
        )

    def wrap_forward(self, model: torch.nn.Module) -> None:
        """bf16 autocast and fp32 outputs around `forward`; with Transformer Engine, its fp8 autocast
        inside (in evaluation too only with `use_autocast_during_eval`)."""
        if self.backend != "TE" or hasattr(model.forward, "_cadence_wrapped_forward"):
            super().wrap_forward(model)
            return
        import transformer_engine.pytorch as te  # optional dependency

        original = model.forward
        recipe = te_recipe(self.recipe_handler)
        during_eval = bool(getattr(self.recipe_handler, "use_autocast_during_eval", False))

        @functools.wraps(original)
        def under_te_autocast(*args: Any, **kwargs: Any) -> Any:
            with te.fp8_autocast(enabled=during_eval or model.training, fp8_recipe=recipe):
                return original(*args, **kwargs)

        model.forward = under_te_autocast
        super().wrap_forward(model)
        model._cadence_original_forward = original  # type: ignore[attr-defined]


def _default_handler(backend: str) -> Any:
    return AORecipeKwargs() if backend == "AO" else TERecipeKwargs()
