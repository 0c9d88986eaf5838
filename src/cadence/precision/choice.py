"""Which mixed precision a training uses: the one parse of the requested precision into a frozen
`PrecisionChoice`, and the one check of what a backend can run.

`choose_precision` runs once per Accelerator, in its settings (before any side effect): it resolves the
argument, the launch record and the environment through `core.settings.resolve`, checks the name, the
FP8 recipe handler and the backend, and returns the value that the process state stores and the
strategy turns into its `Precision` object. Nothing after it parses the name again. Light (no torch
import), so the launcher runs the same check before any worker starts.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from ..core.enums import PrecisionType
from ..core.settings import Resolved, resolve

MIXED_PRECISION_CHOICES: tuple[str, ...] = tuple(PrecisionType.list())


def parse_mixed_precision(value: object, source: str = "mixed_precision") -> str:
    """The lower-case precision name ("no", "fp8", "fp16", "bf16"), or a ValueError naming the choices.

    The one check of a precision name: `choose_precision`, the launcher and the config file use it.
    """
    name = str(value).lower()
    if name not in PrecisionType.list():
        raise ValueError(
            f"Unknown {source} {value!r}: choose one of {', '.join(PrecisionType.list())}."
        )
    return name


@dataclass(frozen=True)
class PrecisionChoice:
    """The requested mixed precision, parsed and checked once (see `choose_precision`).

    `mixed_precision` is the checked name; `source` where it came from ("argument", "launch",
    "env:<NAME>", "default"); `engine` is "deepspeed" when the engine casts and scales itself;
    `fp8_backend` the FP8 backend chosen for fp8 outside DeepSpeed ("AO" or "TE"); the handlers tune
    autocast, the loss scaler and the FP8 recipe.

    Example::

        choice = choose_precision("bf16", {})   # PrecisionChoice(mixed_precision='bf16', ...)
    """

    mixed_precision: str = "no"
    source: str = "default"
    engine: str | None = None
    fp8_backend: str | None = None
    autocast_handler: Any = None
    scaler_handler: Any = None
    fp8_handler: Any = None

    @property
    def explicit(self) -> bool:
        """Whether the precision was passed as an argument (not read from the launcher or environment)."""
        return self.source == "argument"

    def check_device(self, device_type: str, capability: tuple[int, int] | None = None) -> None:
        """Refuse the device this process got when it cannot run the precision (FP8 needs a CUDA GPU of
        compute capability 8.9; XLA trains in bf16). Called once the device exists; the name and the
        backend were checked when the choice was made."""
        if self.engine == "deepspeed":
            return  # DeepSpeed casts itself; its requirements were checked in choose_precision
        _check_device(self.mixed_precision, device_type, capability)

    def adopt(self, existing: PrecisionChoice) -> PrecisionChoice:
        """This choice's handlers on the precision of `existing` (the one the process state was created
        with: a later Accelerator without an explicit precision trains in it)."""
        if existing.mixed_precision == self.mixed_precision:
            return self
        return replace(
            self,
            mixed_precision=existing.mixed_precision,
            source=existing.source,
            engine=existing.engine,
            fp8_backend=existing.fp8_backend,
        )


def resolve_mixed_precision(requested: Any = None, launch: Mapping[str, Any] | None = None) -> str:
    """The checked precision name alone (argument > launch record > environment > "no"): what
    `choose_precision` starts with, for the launchers, which check the device themselves."""
    return _resolve_name(requested, launch).value


def _resolve_name(requested: Any, launch: Mapping[str, Any] | None) -> Resolved:
    resolved = resolve("mixed_precision", requested, "no", dict(launch or {}))
    return Resolved(parse_mixed_precision(resolved.value), resolved.source)


def choose_precision(
    requested: Any = None,
    launch: Mapping[str, Any] | None = None,
    *,
    handlers: Mapping[str, Any] | None = None,
    device_type: str | None = None,
    deepspeed: Any = None,
    fsdp: Any = None,
) -> PrecisionChoice:
    """The one parse and check of the requested precision, before any side effect.

    `requested` is the `mixed_precision` argument (None: the launch record, then `ACCELERATE_MIXED_PRECISION`
    / `CADENCE_MIXED_PRECISION`, then "no"); `handlers` the kwargs handlers by class name (AutocastKwargs,
    GradScalerKwargs, an FP8 recipe); `device_type` the device when already known ("cpu" for cpu=True,
    "xla"), else None; `deepspeed` the DeepSpeed plugin, or a dict of named ones, when DeepSpeed trains
    (it casts itself: its config must not enable the other half precision); `fsdp` the FSDP plugin
    (FSDP and DeepSpeed accept an FP8 recipe without fp8). Raises ValueError, ImportError,
    RuntimeError or NotImplementedError saying what to change.
    """
    resolved = _resolve_name(requested, launch)
    name = resolved.value
    handlers = handlers or {}
    fp8_handler = fp8_recipe_handler(handlers)
    if fp8_handler is not None and name != "fp8" and deepspeed is None and fsdp is None:
        raise ValueError(
            f"Passing in an FP8 configuration ({type(fp8_handler).__name__}) requires setting "
            "`mixed_precision='fp8'`."
        )
    engine = None
    if deepspeed is not None:
        engine = "deepspeed"
        for plugin in deepspeed.values() if isinstance(deepspeed, dict) else [deepspeed]:
            plugin.check_mixed_precision(name)
    fp8_backend = check_precision_supported(
        name,
        device_type=device_type,
        engine=engine,
        fp8_backend=fp8_handler_backend(fp8_handler),
    )
    return PrecisionChoice(
        mixed_precision=name,
        source=resolved.source,
        engine=engine,
        fp8_backend=fp8_backend,
        autocast_handler=handlers.get("AutocastKwargs"),
        scaler_handler=handlers.get("GradScalerKwargs"),
        fp8_handler=fp8_handler,
    )


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


def fp8_recipe_handler(handlers: Mapping[str, Any]) -> Any:
    """The FP8 recipe handler among `handlers` (by class name: AORecipeKwargs, TERecipeKwargs,
    MSAMPRecipeKwargs or the deprecated FP8RecipeKwargs), or None."""
    for name in (*FP8_HANDLER_BACKENDS, "FP8RecipeKwargs"):
        if name in handlers:
            return handlers[name]
    return None


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
) -> str | None:
    """The one place that refuses a precision the backend cannot run, before any worker starts; returns
    the FP8 backend chosen ("AO" or "TE") for fp8 outside DeepSpeed, else None.

    `device_type` is "cuda", "cpu", ... or None when not known yet (the launcher before it counts GPUs);
    `engine` is "deepspeed" when DeepSpeed casts itself; `fp8_backend` is the backend a recipe handler
    asks for ("AO", "TE", "MSAMP"); `capability` is the GPU's compute capability when known (FP8 needs
    8.9: Ada, Hopper or newer). Called by the launchers and by `choose_precision`.
    """
    if mixed_precision != "fp8" or device_type == "xla":
        _check_device(mixed_precision, device_type, capability)
        return None
    if engine == "deepspeed":
        if not _installed("msamp"):
            raise ImportError(
                "mixed_precision='fp8' with DeepSpeed needs MS-AMP (`pip install msamp`); use 'bf16' instead."
            )
        return None
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
    _check_device(mixed_precision, device_type, capability)
    return backend


def _check_device(
    mixed_precision: str, device_type: str | None, capability: tuple[int, int] | None
) -> None:
    if device_type == "xla" and mixed_precision in ("fp16", "fp8"):
        raise ValueError(
            f"mixed_precision={mixed_precision!r} is not supported on XLA devices (TPU): XLA trains in "
            "bf16 without loss scaling. Use mixed_precision='bf16' (or 'no')."
        )
    if mixed_precision != "fp8":
        return
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
