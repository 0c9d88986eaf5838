"""Which sharded / model-parallel backend a training asks for, from the Accelerator's arguments, the
`cadence launch` settings record, or Accelerate's environment variables (in that order).

Runs before any process group exists, so every bad combination fails before a side effect.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from typing import Any

from ..core.enums import DistributedType
from ..core.settings import resolve_flag


@dataclass
class ParallelPlugins:
    """The resolved FSDP plugin, DeepSpeed plugin(s) and ParallelismConfig of a training."""

    fsdp_plugin: Any = None
    deepspeed_plugins: Any = None  # one DeepSpeedPlugin, or a dict name -> DeepSpeedPlugin
    parallelism_config: Any = None


def resolve_parallel_plugins(
    *,
    fsdp_plugin: Any,
    deepspeed_plugins: Any,
    torch_tp_plugin: Any,
    parallelism_config: Any,
    launch: dict[str, Any],
) -> ParallelPlugins:
    """Pick the plugins from the arguments, launch record or environment; raise on bad mixes."""

    from .deepspeed import (  # deferred: a backend's plugin module loads only when asked for
        DeepSpeedPlugin,
        deepspeed_missing_error,
        deepspeed_plugin_from_launch,
    )
    from .fsdp import (  # deferred: a backend's plugin module loads only when asked for
        FullyShardedDataParallelPlugin,
        fsdp_plugin_from_launch,
    )
    from .parallelism import (  # deferred: a backend's plugin module loads only when asked for
        ParallelismConfig,
        TorchTensorParallelPlugin,
        parallelism_from_env,
    )

    if fsdp_plugin is not None and not isinstance(fsdp_plugin, FullyShardedDataParallelPlugin):
        raise TypeError(
            f"fsdp_plugin must be a FullyShardedDataParallelPlugin, got {type(fsdp_plugin).__name__}."
        )
    if fsdp_plugin is None:
        if isinstance(launch.get("fsdp"), dict):
            fsdp_plugin = fsdp_plugin_from_launch(launch["fsdp"])
        elif resolve_flag("use_fsdp", launch={}).value:
            fsdp_plugin = FullyShardedDataParallelPlugin()

    if deepspeed_plugins is not None:
        plugins = (
            deepspeed_plugins.values()
            if isinstance(deepspeed_plugins, dict)
            else [deepspeed_plugins]
        )
        if isinstance(deepspeed_plugins, dict) and not deepspeed_plugins:
            raise ValueError("deepspeed_plugins={} is empty: pass at least one DeepSpeedPlugin.")
        for plugin in plugins:
            if not isinstance(plugin, DeepSpeedPlugin):
                raise TypeError(
                    "deepspeed_plugin(s) must be a DeepSpeedPlugin or a dict of them, got "
                    f"{type(plugin).__name__}."
                )
    elif isinstance(launch.get("deepspeed"), dict):
        deepspeed_plugins = deepspeed_plugin_from_launch(launch["deepspeed"])
    elif resolve_flag("use_deepspeed", launch={}).value:
        deepspeed_plugins = DeepSpeedPlugin()
    if deepspeed_plugins is not None and importlib.util.find_spec("deepspeed") is None:
        raise deepspeed_missing_error("DeepSpeed training (deepspeed_plugin / --use_deepspeed)")
    if fsdp_plugin is not None and deepspeed_plugins is not None:
        raise ValueError(
            "Both FSDP and DeepSpeed were asked for (plugins, launch flags or ACCELERATE_USE_* variables): "
            "choose one."
        )

    if parallelism_config is not None and not isinstance(parallelism_config, ParallelismConfig):
        raise TypeError(
            f"parallelism_config must be a ParallelismConfig, got {type(parallelism_config).__name__}."
        )
    if parallelism_config is None:
        if torch_tp_plugin is not None:
            if not isinstance(torch_tp_plugin, TorchTensorParallelPlugin):
                raise TypeError(
                    "torch_tp_plugin must be a TorchTensorParallelPlugin, got "
                    f"{type(torch_tp_plugin).__name__}."
                )
            parallelism_config = ParallelismConfig(tp_size=torch_tp_plugin.tp_size)
        else:
            parallelism_config = parallelism_from_env()
    if parallelism_config is not None and parallelism_config.sp_enabled:
        _check_sequence_parallel_backend(parallelism_config.sp_size, deepspeed_plugins)
    if parallelism_config is not None and parallelism_config.cp_enabled:
        _check_context_parallel_backend(fsdp_plugin, deepspeed_plugins)
    return ParallelPlugins(fsdp_plugin, deepspeed_plugins, parallelism_config)


def _check_sequence_parallel_backend(sp_size: int, deepspeed_plugins: Any) -> None:
    """sp_size > 1 is DeepSpeed Ulysses: it needs DeepSpeed, with the Ulysses module (0.18.2+)."""
    if deepspeed_plugins is None:
        raise ValueError(
            f"sp_size={sp_size} (sequence parallelism, sp_backend='deepspeed') needs DeepSpeed: pass "
            "deepspeed_plugin=DeepSpeedPlugin(...) or launch with --use_deepspeed; for FSDP2 use "
            "context parallelism (cp_size) instead."
        )
    import importlib.util

    if importlib.util.find_spec("deepspeed") is not None:
        try:
            found = importlib.util.find_spec("deepspeed.runtime.sequence_parallel.ulysses_sp")
        except ModuleNotFoundError:
            found = None
        if found is None:
            raise ImportError(
                f"sp_size={sp_size} needs DeepSpeed 0.18.2 or newer (deepspeed.runtime.sequence_"
                "parallel.ulysses_sp): pip install -U 'deepspeed>=0.18.2'."
            )


def _check_context_parallel_backend(fsdp_plugin: Any, deepspeed_plugins: Any) -> None:
    """cp_size > 1 runs with FSDP2 (sharded over dp_shard_cp), or with DDP when Accelerate's
    ACCELERATE_ALLOW_CP_STANDALONE=true asks for it; never with FSDP1 or DeepSpeed."""
    if deepspeed_plugins is not None:
        raise ValueError(
            "cp_size > 1 (context parallelism) cannot run with DeepSpeed: use FSDP2 "
            "(fsdp_plugin=FullyShardedDataParallelPlugin(fsdp_version=2)), or DeepSpeed's own sequence "
            "parallelism with ParallelismConfig(sp_size=..., sp_backend='deepspeed')."
        )
    if fsdp_plugin is not None and fsdp_plugin.fsdp_version == 2:
        return
    if fsdp_plugin is not None:
        raise ValueError(
            "cp_size > 1 (context parallelism) needs FSDP2, but the fsdp_plugin uses FSDP1: pass "
            "FullyShardedDataParallelPlugin(fsdp_version=2)."
        )
    if not resolve_flag("allow_cp_standalone", launch={}).value:
        raise ValueError(
            "cp_size > 1 (context parallelism) needs FSDP2: pass "
            "fsdp_plugin=FullyShardedDataParallelPlugin(fsdp_version=2), which also shards the model "
            "over the cp ranks. To run it without FSDP (every rank keeps the whole model), set "
            "ACCELERATE_ALLOW_CP_STANDALONE=true."
        )


def configure_state(state: Any, plugins: ParallelPlugins) -> None:
    """Set the AcceleratorState's plugins and distributed type (after the process group exists)."""

    state.fsdp_plugin = None
    state.deepspeed_plugins = None
    state.parallelism_config = plugins.parallelism_config
    state.device_mesh = None
    if plugins.deepspeed_plugins is not None:
        state.distributed_type = DistributedType.DEEPSPEED
        deepspeed = plugins.deepspeed_plugins
        named = deepspeed if isinstance(deepspeed, dict) else {"default": deepspeed}
        for plugin in named.values():
            plugin.enable_mixed_precision(state._mixed_precision)  # checked by choose_precision
        next(iter(named.values())).select(_from_accelerator_state=True)
        state.deepspeed_plugins = deepspeed
    elif plugins.fsdp_plugin is not None:
        state.fsdp_plugin = plugins.fsdp_plugin
        # FSDP at any world size, one process included: a config tested on one GPU takes the same code
        # path and writes the same checkpoint layout as on eight (the state gives it a group of one).
        state.distributed_type = DistributedType.FSDP
        if state._mixed_precision != "no":
            plugins.fsdp_plugin.set_mixed_precision(state._mixed_precision)
        if plugins.fsdp_plugin.fsdp_version == 1:
            from .fsdp import (
                check_fsdp1_supported,  # deferred: a backend's plugin module loads only when asked for
            )

            check_fsdp1_supported(plugins.fsdp_plugin, state.device, state.process_index)


def setup_device_mesh(state: Any) -> None:
    """Check the AcceleratorState's ParallelismConfig against the processes and build its device mesh
    (collective: every rank calls it)."""
    config = state.parallelism_config
    if state.distributed_type == DistributedType.XLA:
        return  # an SPMD mesh over the XLA devices, built by the XLA strategy
    config.validate(
        state.num_processes, state.distributed_type, state.is_fsdp2, state.is_main_process
    )
    if config.total_size > 1 and state.num_processes > 1:
        state.device_mesh = config.get_device_mesh(state.device.type)
