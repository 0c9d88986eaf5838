"""The Accelerator's option dataclasses (the home of what the reference keeps in `utils.dataclasses`).

Two families: the `KwargsHandler`s that tune how a torch object is built (DDP, the grad scaler, the process
group, autocast, the profiler, FP8 recipes), and the configurations of the Accelerator itself (dataloaders,
project layout, gradient accumulation, dynamo). Sharded-training plugins live in `cadence.plugins`.
"""

from __future__ import annotations

import copy
import numbers
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from ..core.enums import DDPCommunicationHookType, DynamoBackend
from ..core.environment import clear_environment
from ..core.profiling import build_profiler
from ..core.settings import env_text, parse_bool, resolve, resolve_flag
from ..diagnostics.settings import parse_seconds


class KwargsHandler:
    """Base of the handlers: `to_kwargs()` gives the fields that differ from the class defaults."""

    def to_dict(self) -> dict[str, Any]:
        """A deep copy of all the fields, as a dict."""
        return copy.deepcopy(self.__dict__)

    def to_kwargs(self) -> dict[str, Any]:
        """Only the fields whose value differs from the class default, as a dict.

        The defaults are those of a handler built without any environment variable, as in the
        reference: a value that came from the environment (`ACCELERATE_DYNAMO_MODE=...`) counts.
        """
        with clear_environment():
            defaults = self.__class__().to_dict()
        return {k: v for k, v in self.to_dict().items() if defaults.get(k) != v}


@dataclass
class AutocastKwargs(KwargsHandler):
    """Settings for `torch.autocast` (whether it is on, whether it caches casts).

    Example::

        from cadence import Accelerator, AutocastKwargs

        handler = AutocastKwargs(cache_enabled=True)
        accelerator = Accelerator(mixed_precision="bf16", kwargs_handlers=[handler])
    """

    enabled: bool = True
    cache_enabled: bool | None = None


@dataclass
class DistributedDataParallelKwargs(KwargsHandler):
    """Settings for `torch.nn.parallel.DistributedDataParallel` and its communication hook.

    Example::

        from cadence import Accelerator, DistributedDataParallelKwargs

        ddp_kwargs = DistributedDataParallelKwargs(find_unused_parameters=True, comm_hook="fp16")
        accelerator = Accelerator(kwargs_handlers=[ddp_kwargs])
    """

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
    """Settings for the fp16 `torch.amp.GradScaler` (initial scale, growth, backoff).

    Example::

        from cadence import Accelerator, GradScalerKwargs

        scaler_kwargs = GradScalerKwargs(init_scale=1024.0, growth_interval=500)
        accelerator = Accelerator(mixed_precision="fp16", kwargs_handlers=[scaler_kwargs])
    """

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

    Example::

        from datetime import timedelta

        from cadence import Accelerator, InitProcessGroupKwargs

        group_kwargs = InitProcessGroupKwargs(timeout=timedelta(hours=1))
        accelerator = Accelerator(kwargs_handlers=[group_kwargs])
    """

    backend: str | None = "nccl"
    init_method: str | None = None
    timeout: timedelta | float | None = None
    stuck_timeout: timedelta | float | None = None

    def __post_init__(self) -> None:
        if self.stuck_timeout is not None:
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
    """Settings for `torch.profiler.profile` used by `Accelerator.profile()`.

    Example::

        from cadence import Accelerator, ProfileKwargs

        profile_kwargs = ProfileKwargs(activities=["cpu"], record_shapes=True)
        accelerator = Accelerator(kwargs_handlers=[profile_kwargs])
        with accelerator.profile() as prof:
            model(inputs)
        print(prof.key_averages().table(row_limit=5))
    """

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
        return build_profiler(self)


@dataclass
class FP8RecipeKwargs(KwargsHandler):
    """Settings of an FP8 training recipe (backend, format, amax history, ...)."""

    backend: str | None = None
    opt_level: str | None = None
    margin: int | None = None
    interval: int | None = None
    fp8_format: str | None = None
    amax_history_len: int | None = None
    amax_compute_algo: str | None = None
    override_linear_precision: tuple | None = None


_FP8_ENV = "ACCELERATE_FP8_"


def _env_flag(name: str, default: bool) -> bool:
    value = env_text(_FP8_ENV + name)
    return default if value in (None, "") else parse_bool(value, _FP8_ENV + name)


@dataclass
class AORecipeKwargs(KwargsHandler):
    """The torchao FP8 recipe for `mixed_precision="fp8"`: a `torchao.float8.Float8LinearConfig` and which
    linear layers to convert.

    Without `config`, one is built with `pad_inner_dim=True` (pads GEMM dimensions to multiples of 16,
    which `torch._scaled_mm` needs) and `enable_fsdp_float8_all_gather=True` (FSDP2 all-gathers float8
    weights: half the bytes of bf16); both can be set here or by `ACCELERATE_FP8_PAD_INNER_DIM` /
    `ACCELERATE_FP8_ENABLE_FSDP_FLOAT8_ALL_GATHER`. `module_filter_func(module, fqn) -> bool` picks the
    layers to convert; by default every linear except the first and the last, and those whose
    dimensions are not multiples of 16.

    Example::

        from cadence import Accelerator
        from cadence.utils import AORecipeKwargs

        accelerator = Accelerator(mixed_precision="fp8", kwargs_handlers=[AORecipeKwargs()])
    """

    config: Any = None
    module_filter_func: Callable | None = None
    pad_inner_dim: bool | None = None
    enable_fsdp_float8_all_gather: bool | None = None

    def __post_init__(self) -> None:
        import importlib.util

        if importlib.util.find_spec("torchao") is None:
            raise ImportError(
                "AORecipeKwargs needs torchao, which is not installed: `pip install torchao` (or use "
                "TERecipeKwargs with Transformer Engine)."
            )
        if self.config is None:
            from torchao.float8 import Float8LinearConfig  # optional dependency

            if self.pad_inner_dim is None:
                self.pad_inner_dim = _env_flag("PAD_INNER_DIM", True)
            if self.enable_fsdp_float8_all_gather is None:
                self.enable_fsdp_float8_all_gather = _env_flag(
                    "ENABLE_FSDP_FLOAT8_ALL_GATHER", True
                )
            self.config = Float8LinearConfig(
                pad_inner_dim=self.pad_inner_dim,
                enable_fsdp_float8_all_gather=self.enable_fsdp_float8_all_gather,
            )


_TE_FORMATS = ("HYBRID", "E4M3", "E5M2")
_TE_AMAX_ALGORITHMS = ("max", "most_recent")


@dataclass
class TERecipeKwargs(KwargsHandler):
    """The Transformer Engine FP8 recipe for `mixed_precision="fp8"` (delayed scaling by default).

    Unset fields come from `ACCELERATE_FP8_*` variables, else: `fp8_format="HYBRID"` (E4M3 forward, E5M2
    backward), `margin=0`, `interval=1`, `amax_history_len=1024`, `amax_compute_algo="most_recent"`,
    `override_linear_precision=(False, False, False)`, `use_autocast_during_eval=False`,
    `use_mxfp8_block_scaling=False`.

    Example::

        from cadence import Accelerator
        from cadence.utils import TERecipeKwargs

        kwargs = TERecipeKwargs(fp8_format="HYBRID")
        accelerator = Accelerator(mixed_precision="fp8", kwargs_handlers=[kwargs])
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
        import importlib.util

        if importlib.util.find_spec("transformer_engine") is None:
            raise ImportError(
                "TERecipeKwargs needs NVIDIA Transformer Engine, which is not installed: "
                "`pip install transformer-engine[pytorch]` (or use AORecipeKwargs with torchao)."
            )
        if self.use_autocast_during_eval is None:
            self.use_autocast_during_eval = _env_flag("USE_AUTOCAST_DURING_EVAL", False)
        if self.margin is None:
            self.margin = int(env_text(_FP8_ENV + "MARGIN", 0))
        if self.interval is None:
            self.interval = int(env_text(_FP8_ENV + "INTERVAL", 1))
        self.fp8_format = str(self.fp8_format or env_text(_FP8_ENV + "FORMAT", "HYBRID")).upper()
        if self.fp8_format not in _TE_FORMATS:
            raise ValueError(f"`fp8_format` must be one of {' or '.join(_TE_FORMATS)}.")
        algorithm = self.amax_compute_algo or env_text(
            _FP8_ENV + "AMAX_COMPUTE_ALGO", "most_recent"
        )
        self.amax_compute_algo = str(algorithm).lower()
        if self.amax_compute_algo not in _TE_AMAX_ALGORITHMS:
            raise ValueError(
                f"`amax_compute_algo` must be one of {' or '.join(_TE_AMAX_ALGORITHMS)}."
            )
        if self.amax_history_len is None:
            self.amax_history_len = int(env_text(_FP8_ENV + "AMAX_HISTORY_LEN", 1024))
        if self.override_linear_precision is None:
            self.override_linear_precision = (
                _env_flag("OVERRIDE_FPROP", False),
                _env_flag("OVERRIDE_DGRAD", False),
                _env_flag("OVERRIDE_WGRAD", False),
            )
        if self.use_mxfp8_block_scaling is None:
            self.use_mxfp8_block_scaling = _env_flag("USE_MXFP8_BLOCK_SCALING", False)


_MSAMP_LEVELS = ("O1", "O2")


@dataclass
class MSAMPRecipeKwargs(KwargsHandler):
    """The MS-AMP FP8 recipe: its optimization level, "O1" or "O2" (default `ACCELERATE_FP8_OPT_LEVEL`, else
    "O2"). Cadence runs MS-AMP through a DeepSpeed config only.

    Example::

        from cadence.utils import MSAMPRecipeKwargs

        kwargs = MSAMPRecipeKwargs(opt_level="O1")
    """

    opt_level: str | None = None

    def __post_init__(self) -> None:
        if self.opt_level is None:
            self.opt_level = env_text(_FP8_ENV + "OPT_LEVEL", "O2")
        if self.opt_level not in _MSAMP_LEVELS:
            raise ValueError(f"`opt_level` must be one of {' or '.join(_MSAMP_LEVELS)}")


@dataclass
class DataLoaderConfiguration:
    """How `prepare` shards, feeds and resumes dataloaders (the reference's fields, plus one Cadence
    switch at the end).

    `resume_exact_order` (Cadence only, default True): a dataloader resumed mid-epoch from a saved
    state continues the saved epoch with the same samples in the same order. False resumes as the
    reference does, to reproduce its numbers: the order is drawn again from the random state of the
    moment and a stateful dataloader skips the batches already handed out (a plain one starts the
    epoch over). See docs/differences.md.

    Example::

        from cadence import Accelerator, DataLoaderConfiguration

        config = DataLoaderConfiguration(split_batches=True, even_batches=False)
        accelerator = Accelerator(dataloader_config=config)
    """

    split_batches: bool = False
    dispatch_batches: bool | None = None
    even_batches: bool = True
    use_seedable_sampler: bool = False
    data_seed: int | None = None
    non_blocking: bool = False
    use_stateful_dataloader: bool = False
    resume_exact_order: bool = True

    def __post_init__(self) -> None:
        for name in (
            "split_batches",
            "dispatch_batches",
            "even_batches",
            "use_seedable_sampler",
            "non_blocking",
            "use_stateful_dataloader",
            "resume_exact_order",
        ):
            if isinstance(getattr(self, name), (str, bytes)):
                raise TypeError(
                    f"DataLoaderConfiguration({name}={getattr(self, name)!r}) takes True or False, not "
                    "a string (any non-empty string would count as True)."
                )
        seed = self.data_seed
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, numbers.Integral)):
            raise TypeError(
                f"DataLoaderConfiguration(data_seed=...) must be an integer or None, got {seed!r}."
            )


@dataclass
class ProjectConfiguration:
    """Where a run keeps its files: project and logging directories, checkpoint naming and limit.

    Example::

        from cadence import Accelerator, ProjectConfiguration

        config = ProjectConfiguration(
            project_dir="runs/demo", automatic_checkpoint_naming=True, total_limit=3
        )
        accelerator = Accelerator(project_config=config)
        accelerator.save_state()  # written under runs/demo/checkpoints/
    """

    project_dir: str | None = None
    logging_dir: str | None = None
    automatic_checkpoint_naming: bool = False
    total_limit: int | None = None
    iteration: int = 0
    save_on_each_node: bool = False

    def set_directories(self, project_dir: str | os.PathLike | None = None) -> None:
        """Set `project_dir`, and `logging_dir` to it when no logging dir was given."""
        self.project_dir = os.fspath(project_dir) if project_dir is not None else None
        if self.logging_dir is None:
            self.logging_dir = self.project_dir

    def __post_init__(self) -> None:
        for name in ("project_dir", "logging_dir"):
            path = getattr(self, name)
            if path is not None and not isinstance(path, (str, os.PathLike)):
                raise TypeError(
                    f"ProjectConfiguration({name}=...) must be a path (str or os.PathLike), got "
                    f"{type(path).__name__}."
                )
        if self.project_dir is not None:
            self.project_dir = os.fspath(self.project_dir)
        self.set_directories(self.project_dir)
        if self.total_limit is not None and (
            not isinstance(self.total_limit, int) or self.total_limit < 0
        ):
            raise ValueError(
                f"total_limit must be a non-negative integer, got {self.total_limit!r}."
            )


@dataclass
class GradientAccumulationPlugin(KwargsHandler):
    """How gradients are accumulated: steps per update, scheduler and dataloader handling (the
    reference's fields, plus one Cadence switch at the end).

    `adjust_last_window` (Cadence only, default True): when a dataloader ends inside an accumulation
    window, the shorter last window's update is the mean gradient of the micro-batches it holds (the
    prepared optimizer's step rescales the gradients it uses; those read between backward and step
    are the reference's). False steps with every micro-step divided by `num_steps`, as the reference
    does, so the last update is smaller. See docs/differences.md.

    Example::

        from cadence import Accelerator, GradientAccumulationPlugin

        plugin = GradientAccumulationPlugin(num_steps=4, sync_with_dataloader=False)
        accelerator = Accelerator(gradient_accumulation_plugin=plugin)
    """

    num_steps: int | None = None
    adjust_scheduler: bool = True
    sync_with_dataloader: bool = True
    sync_each_batch: bool = False
    adjust_last_window: bool = True

    def __post_init__(self) -> None:
        if self.num_steps is not None and (
            not isinstance(self.num_steps, int) or self.num_steps < 1
        ):
            raise ValueError(
                f"GradientAccumulationPlugin.num_steps must be a positive integer, got {self.num_steps!r}."
            )


@dataclass
class TorchDynamoPlugin(KwargsHandler):
    """Settings for `torch.compile` (backend, mode, ...); backend and mode default from launch."""

    backend: DynamoBackend | str | None = None
    mode: str | None = None
    fullgraph: bool | None = None
    dynamic: bool | None = None
    options: Any = None
    disable: bool = False
    use_regional_compilation: bool | None = None

    def __post_init__(self) -> None:
        if self.backend is None:
            self.backend = resolve("dynamo_backend", default="no", launch={}).value
        name = str(getattr(self.backend, "value", self.backend)).upper()
        if name not in DynamoBackend.list():
            raise ValueError(
                f"Unknown dynamo backend {self.backend!r}: use one of {', '.join(DynamoBackend.list())}."
            )
        self.backend = DynamoBackend(name)
        self.mode = self.mode or resolve("dynamo_mode", default="default", launch={}).value
        # Unset flags come from the launcher's variables, as in the reference (dynamic only if set).
        if self.fullgraph is None:
            self.fullgraph = resolve_flag("dynamo_use_fullgraph", launch={}).value
        if self.use_regional_compilation is None:
            self.use_regional_compilation = resolve_flag(
                "dynamo_use_regional_compilation", launch={}
            ).value
        if self.dynamic is None:
            found = resolve("dynamo_use_dynamic", launch={})
            if found.value is not None:
                self.dynamic = parse_bool(found.value, found.source.removeprefix("env:"))

    def to_dict(self) -> dict[str, Any]:
        """All the fields, with the backend as `torch.compile` names it (lower case)."""
        fields = copy.deepcopy(self.__dict__)
        fields["backend"] = self.backend.value.lower()
        return fields

    def to_kwargs(self) -> dict[str, Any]:
        """The fields that differ from the defaults, less `use_regional_compilation` (not a
        `torch.compile` argument)."""
        kwargs = super().to_kwargs()
        kwargs.pop("use_regional_compilation", None)
        return kwargs

    def to_compile_kwargs(self) -> dict[str, Any]:
        """The keyword arguments to pass to `torch.compile` (no `mode` when `options` is set)."""
        kwargs: dict[str, Any] = {"backend": self.backend.value.lower(), "mode": self.mode}
        for name in ("fullgraph", "dynamic", "options", "disable"):
            value = getattr(self, name)
            if value is not None:
                kwargs[name] = value
        if kwargs.get("options") is not None:
            kwargs.pop("mode")  # torch.compile refuses both
        return kwargs
