"""Which mixed precision a training uses: the one parser of its name and the one check of what a
backend can run. Light (no torch import), so the launcher checks before any worker starts and the
Accelerator checks again before the process group exists.
"""

from __future__ import annotations

import importlib.util

from ..core.enums import PrecisionType
from ..core.settings import resolve

MIXED_PRECISION_CHOICES: tuple[str, ...] = tuple(PrecisionType.list())


def parse_mixed_precision(value: object, source: str = "mixed_precision") -> str:
    """The lower-case precision name ("no", "fp8", "fp16", "bf16"), or a ValueError naming the choices.

    The one check of a precision name: the Accelerator, the launcher and the config file all use it.
    """
    name = str(value).lower()
    if name not in PrecisionType.list():
        raise ValueError(
            f"Unknown {source} {value!r}: choose one of {', '.join(PrecisionType.list())}."
        )
    return name


# The reference's FP8 recipe handlers and the backend each one selects.
FP8_HANDLER_BACKENDS: dict[str, str] = {
    "AORecipeKwargs": "AO",
    "TERecipeKwargs": "TE",
    "MSAMPRecipeKwargs": "MSAMP",
}
_FP8_PACKAGES: dict[str, tuple[str, str]] = {
    "AO": ("torchao", "torchao (`pip install torchao`)"),
    "TE": (
        "transformer_engine",
        "NVIDIA Transformer Engine (`pip install transformer-engine[pytorch]`)",
    ),
    "MSAMP": ("msamp", "MS-AMP (`pip install msamp`, from github.com/Azure/MS-AMP)"),
}
FP8_MIN_CAPABILITY = (8, 9)


def _installed(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def fp8_handler_backend(handler: object) -> str | None:
    """The FP8 backend a recipe handler names ("AO", "TE", "MSAMP"), or None (no handler, or the
    deprecated FP8RecipeKwargs without a backend)."""
    if handler is None:
        return None
    named = FP8_HANDLER_BACKENDS.get(type(handler).__name__)
    if named is None:
        backend = getattr(handler, "backend", None)
        named = str(backend).upper() if backend else None
    return named


def resolve_fp8_backend(handler_backend: str | None = None) -> str:
    """The FP8 backend ("AO", "TE" or "MSAMP") a training uses.

    A recipe handler's backend wins (`AORecipeKwargs` -> "AO", ...), then `ACCELERATE_FP8_BACKEND` /
    `CADENCE_FP8_BACKEND`, then the first installed of torchao, Transformer Engine, MS-AMP (the
    reference's order). An ImportError names the packages when none is installed.
    """
    chosen = handler_backend
    if chosen is None:
        chosen = resolve("fp8_backend", launch={}).value
    if chosen is not None and str(chosen).upper() not in ("", "NO"):
        chosen = str(chosen).upper()
        if chosen not in _FP8_PACKAGES:
            raise ValueError(
                f"Unknown FP8 backend {chosen!r}: choose one of {', '.join(_FP8_PACKAGES)} "
                "(ACCELERATE_FP8_BACKEND / the recipe handler you pass)."
            )
        return chosen
    for backend, (module, _) in _FP8_PACKAGES.items():
        if _installed(module):
            return backend
    raise ImportError(
        "mixed_precision='fp8' needs an FP8 backend, and none is installed: install torchao "
        "(`pip install torchao`) or NVIDIA Transformer Engine, or use mixed_precision='bf16'."
    )


def check_precision_supported(
    mixed_precision: str,
    *,
    device_type: str | None,
    engine: str | None = None,
    fp8_backend: str | None = None,
    capability: tuple[int, int] | None = None,
) -> None:
    """The one place that refuses a precision the backend cannot run, before any worker starts.

    `device_type` is "cuda", "cpu", ... or None when not known yet (the launcher before it counts GPUs);
    `engine` is "deepspeed" when DeepSpeed casts itself; `fp8_backend` is the backend a recipe handler
    asks for ("AO", "TE", "MSAMP"); `capability` is the GPU's compute capability when known (FP8 needs
    8.9: Ada, Hopper or newer). Called by the launchers, the Accelerator's settings and the strategy.
    """
    if device_type == "xla" and mixed_precision in ("fp16", "fp8"):
        raise ValueError(
            f"mixed_precision={mixed_precision!r} is not supported on XLA devices (TPU): XLA trains in "
            "bf16 without loss scaling. Use mixed_precision='bf16' (or 'no')."
        )
    if mixed_precision != "fp8":
        return
    if engine == "deepspeed":
        if not _installed("msamp"):
            raise ImportError(
                "mixed_precision='fp8' with DeepSpeed needs MS-AMP (`pip install msamp`); use 'bf16' instead."
            )
        return
    backend = resolve_fp8_backend(fp8_backend)
    module, package = _FP8_PACKAGES[backend]
    if not _installed(module):
        raise ImportError(
            f"mixed_precision='fp8' with the {backend} backend needs {package}, which is not installed; "
            "install it, pick another backend, or use mixed_precision='bf16'."
        )
    if backend == "MSAMP":
        # MS-AMP drives a model and optimizer pair through its own amp.initialize outside DeepSpeed,
        # which Cadence does not do: refused here rather than half-applied.
        raise NotImplementedError(
            "MS-AMP FP8 outside DeepSpeed is not supported by Cadence: use torchao (AORecipeKwargs) or "
            "Transformer Engine (TERecipeKwargs), or MS-AMP through a DeepSpeed config."
        )
    if device_type is not None and device_type != "cuda":
        raise RuntimeError(
            "mixed_precision='fp8' needs an NVIDIA GPU with compute capability 8.9 or newer (Ada, "
            f"Hopper); this training runs on {device_type}. Use mixed_precision='bf16' instead."
        )
    if capability is not None and tuple(capability) < FP8_MIN_CAPABILITY:
        raise RuntimeError(
            "mixed_precision='fp8' needs an NVIDIA GPU with compute capability 8.9 or newer (Ada, "
            f"Hopper); this GPU has {capability[0]}.{capability[1]}. Use mixed_precision='bf16' instead."
        )
