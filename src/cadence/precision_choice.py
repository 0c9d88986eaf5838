"""Which mixed precision a training uses: the one parser of its name and the one check of what a
backend can run. Light (no torch import), so the launcher checks before any worker starts and the
Accelerator checks again before the process group exists.
"""

from __future__ import annotations

import importlib.util

from .enums import PrecisionType

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


def check_precision_supported(
    mixed_precision: str, *, device_type: str | None, engine: str | None = None
) -> None:
    """The one place that refuses a precision the backend cannot run, before any worker starts.

    `device_type` is "cuda", "cpu", ... or None when not known yet (the launcher before it counts GPUs);
    `engine` is "deepspeed" when DeepSpeed casts itself. Called by the launcher and by the Accelerator.
    """
    if mixed_precision != "fp8":
        return
    has_te = importlib.util.find_spec("transformer_engine") is not None
    has_ao = importlib.util.find_spec("torchao") is not None
    has_msamp = importlib.util.find_spec("msamp") is not None
    if engine == "deepspeed":
        if not has_msamp:
            raise ImportError(
                "mixed_precision='fp8' with DeepSpeed needs MS-AMP (`pip install msamp`); use 'bf16' instead."
            )
        return
    if not (has_te or has_ao):
        raise ImportError(
            "mixed_precision='fp8' needs an FP8 backend: install torchao (`pip install torchao`) or "
            "NVIDIA Transformer Engine."
        )
    if device_type is not None and device_type != "cuda":
        raise RuntimeError(
            "mixed_precision='fp8' needs an NVIDIA GPU with compute capability 8.9 or newer (Ada, "
            f"Hopper); this training runs on {device_type}. Use mixed_precision='bf16' instead."
        )
    # Refused here, at launch and at construction alike, rather than in every worker after start-up.
    raise NotImplementedError(
        "mixed_precision='fp8' (torchao / Transformer Engine) is not available in Cadence yet; "
        "use mixed_precision='bf16'."
    )
