"""KwargsHandler dataclasses: how DDP, the grad scaler, the process group, autocast and profiling are built."""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from .enums import DDPCommunicationHookType


class KwargsHandler:
    """Base of the handlers: `to_kwargs()` gives the fields that differ from the class defaults."""

    def to_dict(self) -> dict[str, Any]:
        return copy.deepcopy(self.__dict__)

    def to_kwargs(self) -> dict[str, Any]:
        defaults = self.__class__().to_dict()
        return {k: v for k, v in self.to_dict().items() if defaults.get(k) != v}


@dataclass
class AutocastKwargs(KwargsHandler):
    enabled: bool = True
    cache_enabled: bool | None = None


@dataclass
class DistributedDataParallelKwargs(KwargsHandler):
    dim: int = 0
    broadcast_buffers: bool = True
    bucket_cap_mb: int = 25
    find_unused_parameters: bool = False
    check_reduction: bool = False
    gradient_as_bucket_view: bool = False
    static_graph: bool = False
    comm_hook: DDPCommunicationHookType = DDPCommunicationHookType.NO
    comm_wrapper: DDPCommunicationHookType = DDPCommunicationHookType.NO
    comm_state_option: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name in ("comm_hook", "comm_wrapper"):
            value = getattr(self, name)
            try:
                setattr(self, name, DDPCommunicationHookType(value))
            except ValueError:
                choices = ", ".join(repr(member.value) for member in DDPCommunicationHookType)
                raise ValueError(
                    f"DistributedDataParallelKwargs({name}={value!r}) is not a communication hook: use "
                    f"one of {choices} (or a DDPCommunicationHookType)."
                ) from None


@dataclass
class GradScalerKwargs(KwargsHandler):
    init_scale: float = 65536.0
    growth_factor: float = 2.0
    backoff_factor: float = 0.5
    growth_interval: int = 2000
    enabled: bool = True


@dataclass
class InitProcessGroupKwargs(KwargsHandler):
    """How the process group is created; `timeout` (a timedelta or seconds) defaults to 30 minutes.

    `stuck_timeout` (Cadence only; seconds or timedelta, 0 turns it off) is how long ranks may wait in a
    collective that another rank does not join before every rank stops with a report (default 300 s;
    see cadence.diagnostics).
    """

    backend: str | None = "nccl"
    init_method: str | None = None
    timeout: timedelta | float | None = None
    stuck_timeout: timedelta | float | None = None

    def __post_init__(self) -> None:
        if self.stuck_timeout is not None:
            from .diagnostics.settings import parse_seconds

            parse_seconds(self.stuck_timeout, "InitProcessGroupKwargs.stuck_timeout")
        if self.timeout is not None and not isinstance(self.timeout, timedelta):
            try:
                seconds = float(self.timeout)
            except (TypeError, ValueError):
                seconds = float("nan")
            if not 0 < seconds < float("inf"):  # also refuses NaN and text
                raise ValueError(
                    f"InitProcessGroupKwargs.timeout must be a positive number of seconds or a "
                    f"timedelta, got {self.timeout!r}."
                )
            self.timeout = timedelta(seconds=seconds)


@dataclass
class ProfileKwargs(KwargsHandler):
    activities: list[str] | None = None
    schedule_option: dict[str, int] | None = None
    on_trace_ready: Callable | None = None
    record_shapes: bool = False
    profile_memory: bool = False
    with_stack: bool = False
    with_flops: bool = False
    with_modules: bool = False
    output_trace_dir: str | None = None

    def build(self) -> Any:
        """A `torch.profiler.profile` configured from these settings (not started)."""
        from .profiling import build_profiler

        return build_profiler(self)


@dataclass
class FP8RecipeKwargs(KwargsHandler):
    backend: str | None = None
    opt_level: str | None = None
    margin: int | None = None
    interval: int | None = None
    fp8_format: str | None = None
    amax_history_len: int | None = None
    amax_compute_algo: str | None = None
    override_linear_precision: tuple | None = None
