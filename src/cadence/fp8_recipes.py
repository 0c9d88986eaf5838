"""FP8 recipe handlers per backend (Transformer Engine, MS-AMP, torchao), as the reference names them.

They carry settings only; defaults come from the `ACCELERATE_FP8_*` variables `launch` sets, as in
the reference. Which backend runs is decided by the Accelerator (see `cadence.precision`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .dataclasses import KwargsHandler
from .environment import parse_flag_from_env
from .settings import env_text

_FP8_FORMATS = ("HYBRID", "E4M3", "E5M2")
_AMAX_ALGOS = ("max", "most_recent")
_MSAMP_LEVELS = ("O1", "O2")


def _env(name: str, default: str) -> str:
    return env_text(f"ACCELERATE_FP8_{name}", default)


@dataclass
class TERecipeKwargs(KwargsHandler):
    """Transformer Engine's delayed-scaling FP8 recipe.

    Example:
        >>> TERecipeKwargs(fp8_format="E4M3").amax_history_len
        1024
    """

    use_autocast_during_eval: bool | None = None
    margin: int | None = None
    interval: int | None = None
    fp8_format: str | None = None
    amax_history_len: int | None = None
    amax_compute_algo: str | None = None
    override_linear_precision: tuple[bool, bool, bool] | None = None
    use_mxfp8_block_scaling: bool | None = None

    def __post_init__(self) -> None:
        if self.use_autocast_during_eval is None:
            self.use_autocast_during_eval = parse_flag_from_env(
                "ACCELERATE_FP8_USE_AUTOCAST_DURING_EVAL"
            )
        if self.margin is None:
            self.margin = int(_env("MARGIN", "0"))
        if self.interval is None:
            self.interval = int(_env("INTERVAL", "1"))
        if self.fp8_format is None:
            self.fp8_format = _env("FORMAT", "HYBRID")
        self.fp8_format = self.fp8_format.upper()
        if self.fp8_format not in _FP8_FORMATS:
            raise ValueError(
                f"`fp8_format` must be one of {' or '.join(_FP8_FORMATS)}, got {self.fp8_format!r}."
            )
        if self.amax_compute_algo is None:
            self.amax_compute_algo = _env("AMAX_COMPUTE_ALGO", "most_recent")
        self.amax_compute_algo = self.amax_compute_algo.lower()
        if self.amax_compute_algo not in _AMAX_ALGOS:
            raise ValueError(f"`amax_compute_algo` must be one of {' or '.join(_AMAX_ALGOS)}.")
        if self.amax_history_len is None:
            self.amax_history_len = int(_env("AMAX_HISTORY_LEN", "1024"))
        if self.override_linear_precision is None:
            self.override_linear_precision = (
                parse_flag_from_env("ACCELERATE_FP8_OVERRIDE_FPROP"),
                parse_flag_from_env("ACCELERATE_FP8_OVERRIDE_DGRAD"),
                parse_flag_from_env("ACCELERATE_FP8_OVERRIDE_WGRAD"),
            )
        if self.use_mxfp8_block_scaling is None:
            self.use_mxfp8_block_scaling = parse_flag_from_env(
                "ACCELERATE_FP8_USE_MXFP8_BLOCK_SCALING"
            )


@dataclass
class MSAMPRecipeKwargs(KwargsHandler):
    """MS-AMP's FP8 recipe: its optimisation level, "O1" or "O2"."""

    opt_level: str | None = None

    def __post_init__(self) -> None:
        if self.opt_level is None:
            self.opt_level = _env("OPT_LEVEL", "O2")
        if self.opt_level not in _MSAMP_LEVELS:
            raise ValueError(
                f"`opt_level` must be one of {' or '.join(_MSAMP_LEVELS)}, got {self.opt_level!r}."
            )


@dataclass
class AORecipeKwargs(KwargsHandler):
    """torchao's Float8 recipe: its `Float8LinearConfig` and which linear layers to convert."""

    config: Any = None
    module_filter_func: Callable[[Any, str], bool] | None = None
    pad_inner_dim: bool | None = None
    enable_fsdp_float8_all_gather: bool | None = None

    def __post_init__(self) -> None:
        if self.pad_inner_dim is None:
            self.pad_inner_dim = parse_flag_from_env("ACCELERATE_FP8_PAD_INNER_DIM", True)
        if self.enable_fsdp_float8_all_gather is None:
            self.enable_fsdp_float8_all_gather = parse_flag_from_env(
                "ACCELERATE_FP8_ENABLE_FSDP_FLOAT8_ALL_GATHER", True
            )
