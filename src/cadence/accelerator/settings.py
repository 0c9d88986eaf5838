"""Turn the Accelerator's constructor arguments (plus the launcher's settings) into one checked record.

Everything here runs before any process group exists, so bad arguments fail before any side effect.
"""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from ..core.enums import DynamoBackend, RNGType
from ..core.input_errors import rank_named_errors
from ..core.settings import Resolved, resolve, resolve_flag
from ..options.dataclasses import (
    DataLoaderConfiguration,
    GradientAccumulationPlugin,
    KwargsHandler,
    ProjectConfiguration,
    TorchDynamoPlugin,
)
from ..plugins.resolve import resolve_parallel_plugins
from ..precision.choice import PrecisionChoice, choose_precision
from ..xla.runtime import xla_requested

if TYPE_CHECKING:
    from ..fault_tolerance.config import FaultToleranceConfig

# Constructor arguments of older releases that still reach us through user scripts.
_DATALOADER_ALIASES = ("dispatch_batches", "even_batches", "use_seedable_sampler")

_LATER_FEATURES = {
    "megatron_lm_plugin": "Megatron-LM",
}


@dataclass
class AcceleratorSettings:
    """The checked settings an `Accelerator` is built from, one field per choice."""

    device_placement: bool
    precision: PrecisionChoice
    cpu: bool
    dataloader_config: DataLoaderConfiguration
    project_config: ProjectConfiguration
    accumulation_plugin: GradientAccumulationPlugin
    rng_types: list[str]
    handlers: dict[str, KwargsHandler] = field(default_factory=dict)
    dynamo_plugin: TorchDynamoPlugin | None = None
    log_with: Any = None
    fsdp_plugin: Any = None
    deepspeed_plugins: Any = None
    torch_tp_plugin: Any = None
    parallelism_config: Any = None
    # Per-step fault tolerance (torchft) for this replica group, or None (off).
    fault_tolerance: FaultToleranceConfig | None = None
    # Where the settings read from the launcher or the environment came from (printed in debug mode).
    sources: dict[str, Resolved] = field(default_factory=dict)

    @classmethod
    @rank_named_errors
    def resolve(
        cls, *, launch: dict[str, Any], unknown: dict[str, Any], **args: Any
    ) -> AcceleratorSettings:
        """Check the `Accelerator` arguments and resolve them, with the launch settings."""
        _check_flags(args)
        unknown = dict(unknown)
        kwargs_handlers = args["kwargs_handlers"]
        if "kwarg_handler" in unknown:  # the spec's own profile example spells it this way
            if kwargs_handlers is not None:
                raise TypeError("Pass kwargs_handlers only once (kwarg_handler is an alias of it).")
            kwargs_handlers = unknown.pop("kwarg_handler")
        dataloader_config = _dataloader_config(args, unknown)
        project_config = _project_config(args["project_dir"], args["project_config"], unknown)
        if unknown:
            raise TypeError(
                f"Accelerator() got unexpected keyword argument(s): {', '.join(sorted(unknown))}. "
                "See the Accelerator reference for the accepted arguments."
            )
        for name, feature in _LATER_FEATURES.items():
            if args[name] is not None:
                raise NotImplementedError(
                    f"{feature} support ({name}=...) is not available in Cadence yet."
                )
        steps = args["gradient_accumulation_steps"]
        sources = {
            "gradient_accumulation_steps": resolve(
                "gradient_accumulation_steps", None if steps == 1 else steps, 1, launch
            ),
            "dynamo_backend": resolve("dynamo_backend", args["dynamo_backend"], "no", {}),
        }
        sources["use_cpu"] = resolve_flag("use_cpu", args["cpu"], launch)
        sources["debug"] = resolve_flag("debug", None, launch)
        xla = xla_requested(bool(sources["use_cpu"].value), launch)
        if xla and (args["deepspeed_plugins"] or args["deepspeed_plugin"]):
            raise _xla_deepspeed_error()
        parallel = resolve_parallel_plugins(
            fsdp_plugin=args["fsdp_plugin"],
            deepspeed_plugins=args["deepspeed_plugins"] or args["deepspeed_plugin"],
            torch_tp_plugin=args["torch_tp_plugin"],
            parallelism_config=args["parallelism_config"],
            launch=launch,
        )
        handlers = _handlers(kwargs_handlers)
        # The one parse and check of the precision. The device is known here only for cpu=True and
        # XLA; the strategy checks the device it gets (an FP8 GPU) once it exists.
        precision = choose_precision(
            args["mixed_precision"],
            launch,
            handlers=handlers,
            device_type="xla" if xla else "cpu" if args["cpu"] else None,
            deepspeed=parallel.deepspeed_plugins,
            fsdp=parallel.fsdp_plugin,
        )
        sources = {
            "mixed_precision": Resolved(precision.mixed_precision, precision.source),
            **sources,
        }
        if xla and parallel.deepspeed_plugins:  # asked for through the launcher or the environment
            raise _xla_deepspeed_error()
        fault_tolerance = None
        handler = handlers.get("FaultToleranceConfig")
        if resolve("fault_tolerance", explicit=handler, launch=launch).value is not None:
            from ..fault_tolerance.config import (  # deferred: only for a script that turns it on
                check_parallelism,
                resolve_fault_tolerance,
            )

            fault_tolerance = resolve_fault_tolerance(handler, launch)
            check_parallelism(
                fault_tolerance,
                fsdp_plugin=parallel.fsdp_plugin,
                deepspeed_plugins=parallel.deepspeed_plugins,
                torch_tp_plugin=args["torch_tp_plugin"],
                parallelism_config=parallel.parallelism_config,
            )
        return cls(
            device_placement=bool(args["device_placement"]),
            precision=precision,
            cpu=bool(args["cpu"]),
            dataloader_config=dataloader_config,
            project_config=project_config,
            accumulation_plugin=_accumulation_plugin(args, launch),
            rng_types=_rng_types(args["rng_types"]),
            handlers=handlers,
            dynamo_plugin=_dynamo_plugin(args["dynamo_backend"], args["dynamo_plugin"], launch),
            log_with=args["log_with"],
            fsdp_plugin=parallel.fsdp_plugin,
            deepspeed_plugins=parallel.deepspeed_plugins,
            torch_tp_plugin=args["torch_tp_plugin"],
            parallelism_config=parallel.parallelism_config,
            fault_tolerance=fault_tolerance,
            sources=sources,
        )


def _check_flags(args: dict[str, Any]) -> None:
    # bool("false") is True: a string here (from argparse or an environment variable) is a bug.
    names = ["device_placement", "cpu", "step_scheduler_with_optimizer"]
    if not args["split_batches_unset"]:
        names.append("split_batches")
    for name in names:
        if isinstance(args[name], (str, bytes)):
            raise TypeError(
                f"Accelerator({name}={args[name]!r}): {name} takes True or False, not a string "
                "(any non-empty string would count as True)."
            )


def _dataloader_config(args: dict[str, Any], unknown: dict[str, Any]) -> DataLoaderConfiguration:
    given = args["dataloader_config"]
    if given is not None and not isinstance(given, DataLoaderConfiguration):
        raise TypeError(
            f"dataloader_config must be a DataLoaderConfiguration, got {type(given).__name__}."
        )
    config = replace(given) if given is not None else DataLoaderConfiguration()
    overrides = {name: unknown.pop(name) for name in _DATALOADER_ALIASES if name in unknown}
    if not args["split_batches_unset"]:
        overrides["split_batches"] = args["split_batches"]
    if overrides and given is not None:
        raise ValueError(
            f"Pass {', '.join(sorted(overrides))} inside dataloader_config, not next to it: "
            "the two would conflict."
        )
    for name, value in overrides.items():
        warnings.warn(
            f"Accelerator({name}=...) is deprecated; use "
            f"Accelerator(dataloader_config=DataLoaderConfiguration({name}=...)).",
            FutureWarning,
            stacklevel=4,
        )
        setattr(config, name, value)
    return config


def _project_config(
    project_dir: Any, project_config: ProjectConfiguration | None, unknown: dict[str, Any]
) -> ProjectConfiguration:
    logging_dir = unknown.pop("logging_dir", None)
    if project_config is not None and not isinstance(project_config, ProjectConfiguration):
        raise TypeError(
            f"project_config must be a ProjectConfiguration, got {type(project_config).__name__}."
        )
    for name, path in (("project_dir", project_dir), ("logging_dir", logging_dir)):
        if path is not None and not isinstance(path, (str, os.PathLike)):
            raise TypeError(
                f"Accelerator({name}=...) must be a path (str or os.PathLike), got {type(path).__name__}."
            )
    config = project_config if project_config is not None else ProjectConfiguration()
    if project_dir is not None:
        if config.project_dir is not None and os.fspath(project_dir) != config.project_dir:
            raise ValueError(
                f"project_dir={os.fspath(project_dir)!r} conflicts with project_config.project_dir="
                f"{config.project_dir!r}; pass only one."
            )
        config.set_directories(project_dir)
    if logging_dir is not None:
        config.logging_dir = os.fspath(logging_dir)
    return config


def _accumulation_plugin(
    args: dict[str, Any], launch: dict[str, Any]
) -> GradientAccumulationPlugin:
    plugin = args["gradient_accumulation_plugin"]
    steps = args["gradient_accumulation_steps"]
    if plugin is not None:
        if steps != 1:
            raise ValueError(
                "Pass either gradient_accumulation_steps or gradient_accumulation_plugin, not both: "
                "set num_steps on the plugin."
            )
        if not isinstance(plugin, GradientAccumulationPlugin):
            raise TypeError(
                f"gradient_accumulation_plugin must be a GradientAccumulationPlugin, got {type(plugin).__name__}."
            )
        return plugin
    if steps == 1:
        from_launch = resolve("gradient_accumulation_steps", None, None, launch).value
        if from_launch is not None:
            try:
                steps = int(from_launch)
            except ValueError:
                raise ValueError(
                    f"gradient_accumulation_steps from the launcher (--gradient_accumulation_steps or "
                    f"ACCELERATE_GRADIENT_ACCUMULATION_STEPS) must be a positive integer, got {from_launch!r}."
                ) from None
    if not isinstance(steps, int) or isinstance(steps, bool) or steps < 1:
        raise ValueError(f"gradient_accumulation_steps must be a positive integer, got {steps!r}.")
    return GradientAccumulationPlugin(num_steps=steps)


def _xla_deepspeed_error() -> ValueError:
    return ValueError(
        "DeepSpeed does not run on XLA devices (TPU): drop the DeepSpeed plugin, or train on GPUs/CPU "
        "(cpu=True, or CADENCE_USE_XLA=0 to keep torch_xla out). On XLA, shard with an FSDP plugin "
        "(FSDPv2 through SPMD)."
    )


def _rng_types(rng_types: Any) -> list[str]:
    if rng_types is None:
        return ["generator"]
    if isinstance(rng_types, (str, RNGType)):
        rng_types = [rng_types]
    if not isinstance(rng_types, (list, tuple)):
        raise TypeError(
            f"rng_types must be a list of names ({', '.join(RNGType.list())}), got "
            f"{type(rng_types).__name__}."
        )
    result = []
    for item in rng_types:
        try:
            result.append(RNGType(str(item)).value)
        except ValueError:
            raise ValueError(
                f"Unknown rng_types entry {item!r}: use {', '.join(RNGType.list())}."
            ) from None
    return result


def _handlers(kwargs_handlers: Any) -> dict[str, KwargsHandler]:
    found: dict[str, KwargsHandler] = {}
    if kwargs_handlers is not None and not isinstance(kwargs_handlers, (list, tuple)):
        raise TypeError(
            f"kwargs_handlers must be a list of handlers, got {type(kwargs_handlers).__name__}: "
            f"write kwargs_handlers=[{type(kwargs_handlers).__name__}(...)]."
        )
    for handler in kwargs_handlers or []:
        if not isinstance(handler, KwargsHandler):
            raise TypeError(
                f"kwargs_handlers takes KwargsHandler objects (DistributedDataParallelKwargs, "
                f"GradScalerKwargs, ...), got {type(handler).__name__}."
            )
        name = type(handler).__name__
        if name in found:
            raise ValueError(f"You can only pass one {name} in kwargs_handlers.")
        found[name] = handler
    backend = getattr(found.get("InitProcessGroupKwargs"), "backend", None)
    if backend is not None:
        _check_backend(backend)
    return found


def _check_backend(backend: Any) -> None:
    """An unknown process-group backend fails here, not after the rendezvous store was started."""
    import torch.distributed as dist

    known = set(getattr(dist.Backend, "backend_list", ())) or {"gloo", "nccl", "mpi", "ucc"}
    # "cpu:gloo,cuda:nccl" names one backend per device type.
    names = [part.split(":")[-1].strip().lower() for part in str(backend).split(",")]
    unknown = [name for name in names if name not in known]
    if not isinstance(backend, str) or unknown or not names:
        raise ValueError(
            f"InitProcessGroupKwargs(backend={backend!r}) is not a torch.distributed backend: use one of "
            f"{', '.join(sorted(k for k in known if k != 'undefined'))} (or None for the default: "
            "nccl on GPUs, gloo on CPU)."
        )


def _dynamo_plugin(backend: Any, plugin: Any, launch: dict[str, Any]) -> TorchDynamoPlugin | None:
    if backend is not None and plugin is not None:
        raise ValueError("Pass either dynamo_backend or dynamo_plugin, not both.")
    if plugin is not None:
        if not isinstance(plugin, TorchDynamoPlugin):
            raise TypeError(
                f"dynamo_plugin must be a TorchDynamoPlugin, got {type(plugin).__name__}."
            )
        return plugin
    if backend is None:
        dynamo = launch.get("dynamo") or {}
        backend = dynamo.get("backend") or resolve("dynamo_backend", launch={}).value
        if backend is None:
            return None
        return _checked_dynamo(
            backend,
            mode=dynamo.get("mode"),
            fullgraph=dynamo.get("fullgraph"),
            dynamic=dynamo.get("dynamic"),
        )
    return _checked_dynamo(backend)


def _checked_dynamo(backend: Any, **options: Any) -> TorchDynamoPlugin | None:
    name = str(backend).upper()
    if name not in DynamoBackend.list():
        raise ValueError(
            f"Unknown dynamo_backend {backend!r}: use one of {', '.join(DynamoBackend.list())}."
        )
    if name == "NO":
        return None
    return TorchDynamoPlugin(backend=name, **options)
