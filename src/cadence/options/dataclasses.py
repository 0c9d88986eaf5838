"""The Accelerator's option dataclasses (the home of what Accelerate keeps in `utils.dataclasses`).

Two families: the `KwargsHandler`s that tune how a torch object is built (DDP, the grad scaler, the process
group, autocast, the profiler, FP8 recipes), and the configurations of the Accelerator itself (dataloaders,
project layout, gradient accumulation, dynamo). The dataloader and project configurations live in
`cadence.options.configurations` and are re-exported here. Sharded-training plugins live in
`cadence.plugins`.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from ..core.enums import DDPCommunicationHookType, DynamoBackend
from ..core.environment import clear_environment
from ..core.profiling import build_profiler
from ..core.settings import env_text, parse_bool, resolve, resolve_flag
from ..diagnostics.settings import parse_seconds
from .configurations import DataLoaderConfiguration as DataLoaderConfiguration
from .configurations import ProjectConfiguration as ProjectConfiguration


class KwargsHandler:
    """Base of the handlers: `to_kwargs()` gives the fields that differ from the class defaults."""

    def to_dict(self) -> dict[str, Any]:
        """All the fields, as a deep-copied dict.

        Returns:
            dict[str, Any]: Field names to values.
        """
        return copy.deepcopy(self.__dict__)

    def to_kwargs(self) -> dict[str, Any]:
        """Only the fields whose value differs from the class's defaults, as a dict.

        A value that came from an environment variable counts as different, as in Accelerate.

        Returns:
            dict[str, Any]: Field names to values.
        """
        with clear_environment():
            defaults = self.__class__().to_dict()
        return {k: v for k, v in self.to_dict().items() if defaults.get(k) != v}


@dataclass
class AutocastKwargs(KwargsHandler):
    """Settings of `torch.autocast` for the Accelerator's mixed precision, or for one `accelerator.autocast()` block.

    Args:
        enabled (bool): Whether autocast is on (default True). `AutocastKwargs(enabled=False)` in
            `accelerator.autocast(...)` computes a block in full precision.
        cache_enabled (bool | None): Whether autocast caches the casts of weights inside the block;
            None keeps torch's default.

    Example:
        >>> import torch
        >>> from cadence import Accelerator, AutocastKwargs
        >>> accelerator = Accelerator(mixed_precision="bf16", cpu=True,
        ...                           kwargs_handlers=[AutocastKwargs(cache_enabled=True)])
        >>> accelerator.mixed_precision
        'bf16'
    """

    enabled: bool = True
    cache_enabled: bool | None = None


@dataclass
class DistributedDataParallelKwargs(KwargsHandler):
    """Settings of `torch.nn.parallel.DistributedDataParallel`, which wraps models on several processes.

    Each field is passed to DDP when it differs from its default; see PyTorch's DDP documentation.

    Args:
        dim (int): The dimension inputs are scattered along (default 0).
        broadcast_buffers (bool): Broadcast the buffers of rank 0 at each forward (default True).
        bucket_cap_mb (int): The size of a gradient all-reduce bucket in MiB (default 25).
        find_unused_parameters (bool): Look for parameters that did not take part in the forward, for
            models whose forward skips some (default False; it costs a graph traversal per step).
        check_reduction (bool): Kept for compatibility; DDP ignores it (default False).
        gradient_as_bucket_view (bool): Let gradients be views into the all-reduce buckets, saving
            memory (default False).
        static_graph (bool): The set of used parameters is the same every step (default False).
        comm_hook (DDPCommunicationHookType | str): Compress gradients before the all-reduce: "no"
            (default), "fp16", "bf16", "power_sgd", "batched_power_sgd". Another value raises ValueError.
        comm_wrapper (DDPCommunicationHookType | str): Wrap `comm_hook` ("no", "fp16", "bf16").
        comm_state_option (dict): Options of the hook's state (PowerSGD's `matrix_approximation_rank`,
            ...).

    Example:
        >>> from cadence import Accelerator, DistributedDataParallelKwargs
        >>> ddp_kwargs = DistributedDataParallelKwargs(find_unused_parameters=True, comm_hook="fp16")
        >>> accelerator = Accelerator(kwargs_handlers=[ddp_kwargs])
        >>> ddp_kwargs.to_kwargs()
        {'find_unused_parameters': True, 'comm_hook': <DDPCommunicationHookType.FP16: 'fp16'>}
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
    """Settings of the loss scaler of fp16 training (`torch.amp.GradScaler`).

    Args:
        init_scale (float): The first loss scale (default 65536.0).
        growth_factor (float): What the scale is multiplied by after `growth_interval` steps without
            overflow (default 2.0).
        backoff_factor (float): What the scale is multiplied by after an overflow (default 0.5).
        growth_interval (int): Steps without overflow before the scale grows (default 2000).
        enabled (bool): Whether to scale at all (default True).

    Example:
        >>> from cadence import Accelerator, GradScalerKwargs
        >>> handler = GradScalerKwargs(init_scale=1024.0, growth_interval=500)
        >>> accelerator = Accelerator(mixed_precision="fp16", cpu=True, kwargs_handlers=[handler])
        >>> accelerator.scaler.get_scale()
        1024.0
    """

    init_scale: float = 65536.0
    growth_factor: float = 2.0
    backoff_factor: float = 0.5
    growth_interval: int = 2000
    enabled: bool = True


@dataclass
class InitProcessGroupKwargs(KwargsHandler):
    """How the torch.distributed process group is created, and how long collectives may wait.

    Args:
        backend (str | None): The backend ("nccl", "gloo", "mpi", "ucc", or per device type like
            "cpu:gloo,cuda:nccl"); the default "nccl" applies on GPUs, gloo is used on CPUs. An unknown
            name raises ValueError when the Accelerator is created, before anything starts.
        init_method (str | None): torch's `init_method` URL; None uses the launcher's rendezvous.
        timeout (datetime.timedelta | float | None): How long a collective may take before torch fails
            it (a timedelta or seconds; None: 30 minutes). A non-positive value raises ValueError.
        stuck_timeout (datetime.timedelta | float | None): Cadence only: how long processes may wait in
            a collective that another process does not join before every process stops with a report of
            where each one is (seconds or a timedelta; 0 turns the stop off; None: 300 s or
            `CADENCE_STUCK_TIMEOUT`).

    Example:
        >>> from datetime import timedelta
        >>> from cadence import Accelerator, InitProcessGroupKwargs
        >>> handler = InitProcessGroupKwargs(timeout=timedelta(hours=1), stuck_timeout=600)
        >>> accelerator = Accelerator(kwargs_handlers=[handler])
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
    """Settings of the `torch.profiler.profile` that `accelerator.profile()` runs.

    Args:
        activities (list[str] | None): What to record: "cpu", "cuda", "xpu" (None: the CPU, and the
            GPU when there is one).
        schedule_option (dict[str, int] | None): A `torch.profiler.schedule`: keys `wait`, `warmup`,
            `active`, `repeat`, `skip_first`. None records every step.
        on_trace_ready (Callable | None): Called with the profiler when a trace is ready.
        record_shapes (bool): Record the input shapes of operators (default False).
        profile_memory (bool): Record memory allocations (default False).
        with_stack (bool): Record source locations (default False).
        with_flops (bool): Estimate FLOPs of matrix products and convolutions (default False).
        with_modules (bool): Record the module hierarchy (default False).
        output_trace_dir (str | None): Write a Chrome trace per process into this folder when the
            block ends.

    Example:
        >>> import torch
        >>> from cadence import Accelerator, ProfileKwargs
        >>> accelerator = Accelerator(kwargs_handlers=[ProfileKwargs(activities=["cpu"])])
        >>> with accelerator.profile() as profiler:
        ...     _ = torch.ones(64, 64) @ torch.ones(64, 64)
        >>> len(profiler.key_averages()) > 0
        True
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
        """A `torch.profiler.profile` configured from these settings, not started.

        Returns:
            torch.profiler.profile: The profiler.
        """
        return build_profiler(self)


@dataclass
class FP8RecipeKwargs(KwargsHandler):
    """An FP8 recipe named by its backend (Accelerate's older, generic form of the recipe handlers).

    Prefer `AORecipeKwargs` (torchao) or `TERecipeKwargs` (Transformer Engine).

    Args:
        backend (str | None): "AO", "TE" or "MSAMP"; None picks the installed one.
        opt_level (str | None): MS-AMP's optimization level ("O1", "O2").
        margin (int | None): Transformer Engine's scaling-factor margin.
        interval (int | None): Transformer Engine's scaling-factor update interval.
        fp8_format (str | None): "HYBRID", "E4M3" or "E5M2".
        amax_history_len (int | None): How many steps of amax history Transformer Engine keeps.
        amax_compute_algo (str | None): "max" or "most_recent".
        override_linear_precision (tuple | None): Three bools: run the forward, data-gradient or
            weight-gradient products in higher precision.
    """

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
    """The torchao FP8 recipe for `mixed_precision="fp8"`: which linear layers to convert and how.

    Args:
        config (torchao.float8.Float8LinearConfig | None): torchao's configuration. None builds one from
            `pad_inner_dim` and `enable_fsdp_float8_all_gather`.
        module_filter_func (Callable | None): `fn(module, fqn) -> bool` choosing the layers to convert;
            None converts every linear layer except the first and the last, and those whose dimensions
            are not multiples of 16.
        pad_inner_dim (bool | None): Pad matrix dimensions to multiples of 16, as `torch._scaled_mm`
            needs (None: `ACCELERATE_FP8_PAD_INNER_DIM`, else True).
        enable_fsdp_float8_all_gather (bool | None): Under FSDP2, all-gather weights in float8, half the
            bytes of bf16 (None: `ACCELERATE_FP8_ENABLE_FSDP_FLOAT8_ALL_GATHER`, else True).

    Raises:
        ImportError: torchao is not installed.

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

    Fields left None come from the `ACCELERATE_FP8_*` variables, else from the defaults below.

    Args:
        use_autocast_during_eval (bool | None): Keep FP8 autocast in evaluation too (default False).
        margin (int | None): Margin of the scaling factor (default 0).
        interval (int | None): Steps between scaling-factor updates (default 1).
        fp8_format (str | None): "HYBRID" (E4M3 forward, E5M2 backward; default), "E4M3" or "E5M2".
            Another value raises ValueError.
        amax_history_len (int | None): Steps of amax history kept (default 1024).
        amax_compute_algo (str | None): "most_recent" (default) or "max". Another value raises
            ValueError.
        override_linear_precision (tuple[bool, bool, bool] | None): Run the forward, data-gradient or
            weight-gradient products in higher precision (default all False).
        use_mxfp8_block_scaling (bool | None): Use MXFP8 block scaling (Blackwell GPUs; default False).

    Raises:
        ImportError: Transformer Engine is not installed.
        ValueError: An unknown `fp8_format` or `amax_compute_algo`.

    Example::

        from cadence import Accelerator
        from cadence.utils import TERecipeKwargs

        accelerator = Accelerator(mixed_precision="fp8", kwargs_handlers=[TERecipeKwargs(fp8_format="HYBRID")])
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
    """The MS-AMP FP8 recipe; Cadence runs MS-AMP through a DeepSpeed config only.

    Args:
        opt_level (str | None): "O1" or "O2" (None: `ACCELERATE_FP8_OPT_LEVEL`, else "O2"). Another
            value raises ValueError.

    Example:
        >>> from cadence.utils import MSAMPRecipeKwargs
        >>> MSAMPRecipeKwargs(opt_level="O1").opt_level
        'O1'
    """

    opt_level: str | None = None

    def __post_init__(self) -> None:
        if self.opt_level is None:
            self.opt_level = env_text(_FP8_ENV + "OPT_LEVEL", "O2")
        if self.opt_level not in _MSAMP_LEVELS:
            raise ValueError(f"`opt_level` must be one of {' or '.join(_MSAMP_LEVELS)}")


@dataclass
class GradientAccumulationPlugin(KwargsHandler):
    """How gradients are accumulated over micro-batches, beyond their number.

    Args:
        num_steps (int | None): Micro-batches per optimizer step. A value below 1 raises ValueError.
        adjust_scheduler (bool): Step a prepared scheduler once per optimizer step, not per micro-batch
            (default True).
        sync_with_dataloader (bool): The end of a prepared dataloader closes the accumulation window
            (default True), so no gradient carries over into the next epoch.
        sync_each_batch (bool): All-reduce gradients on every micro-batch, not only on the last of a
            window: more communication, less memory under FSDP (default False).
        adjust_last_window (bool): Cadence only: the update of a dataloader's last, shorter window is the
            mean gradient of the micro-batches it holds (default True). False divides every micro-batch
            by `num_steps`, as Accelerate does, so that last update is smaller. See "Differences from
            Accelerate".

    Raises:
        ValueError: A `num_steps` below 1.

    Example:
        >>> from cadence import Accelerator
        >>> from cadence.utils import GradientAccumulationPlugin
        >>> plugin = GradientAccumulationPlugin(num_steps=4, sync_with_dataloader=False)
        >>> Accelerator(gradient_accumulation_plugin=plugin).gradient_accumulation_steps
        4
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
    """Settings of `torch.compile` for the models `prepare()` returns.

    Fields left None come from `cadence launch --dynamo_*` / the `ACCELERATE_DYNAMO_*` variables.

    Args:
        backend (DynamoBackend | str | None): The compiler backend ("inductor", "eager", "aot_eager",
            "cudagraphs", ...; "no" turns compilation off). An unknown name raises ValueError.
        mode (str | None): "default", "reduce-overhead", "max-autotune", ...
        fullgraph (bool | None): Require the whole forward to compile as one graph.
        dynamic (bool | None): Compile for dynamic shapes.
        options (dict | None): Backend options (then `mode` is not passed: torch refuses both).
        disable (bool): Turn compilation off while keeping the settings (default False).
        use_regional_compilation (bool | None): Compile each repeated block once and reuse it, which
            is faster to compile than the whole model.

    Raises:
        ValueError: An unknown backend.

    Example:
        >>> from cadence.utils import TorchDynamoPlugin
        >>> TorchDynamoPlugin(backend="eager", mode="default").to_compile_kwargs()
        {'backend': 'eager', 'mode': 'default', 'fullgraph': False, 'disable': False}
    """

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
        """All the fields, with the backend lower-cased as `torch.compile` spells it.

        Returns:
            dict[str, Any]: Field names to values.
        """
        fields = copy.deepcopy(self.__dict__)
        fields["backend"] = self.backend.value.lower()
        return fields

    def to_kwargs(self) -> dict[str, Any]:
        """The fields that differ from the defaults, without `use_regional_compilation` (not a `torch.compile` argument).

        Returns:
            dict[str, Any]: Field names to values.
        """
        kwargs = super().to_kwargs()
        kwargs.pop("use_regional_compilation", None)
        return kwargs

    def to_compile_kwargs(self) -> dict[str, Any]:
        """The keyword arguments for `torch.compile` (no `mode` when `options` is set).

        Returns:
            dict[str, Any]: Keyword arguments.
        """
        kwargs: dict[str, Any] = {"backend": self.backend.value.lower(), "mode": self.mode}
        for name in ("fullgraph", "dynamic", "options", "disable"):
            value = getattr(self, name)
            if value is not None:
                kwargs[name] = value
        if kwargs.get("options") is not None:
            kwargs.pop("mode")  # torch.compile refuses both
        return kwargs
