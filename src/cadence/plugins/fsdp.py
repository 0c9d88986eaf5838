"""FullyShardedDataParallelPlugin: the settings of FSDP (version 2 `fully_shard`, or version 1 wrapper).

Every field left at `None` is read from the environment variables the launcher sets (`FSDP_VERSION`,
`FSDP_OFFLOAD_PARAMS`, ...), then falls back to the documented default. After construction the fields
hold torch objects (`ShardingStrategy`, `MixedPrecisionPolicy`, `StateDictType`, ...).
"""

from __future__ import annotations

import functools
import logging
import os
import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import torch

from ..core.input_errors import rank_prefix
from ..core.settings import parse_bool as as_bool
from ..core.settings import plugin_env_bool, plugin_env_text

logger = logging.getLogger(__name__)

SHARDING_STRATEGIES = (
    "FULL_SHARD",
    "SHARD_GRAD_OP",
    "NO_SHARD",
    "HYBRID_SHARD",
    "HYBRID_SHARD_ZERO2",
)
BACKWARD_PREFETCH_CHOICES = ("BACKWARD_PRE", "BACKWARD_POST", "NO_PREFETCH")
AUTO_WRAP_POLICIES = ("TRANSFORMER_BASED_WRAP", "SIZE_BASED_WRAP", "NO_WRAP")
STATE_DICT_TYPES = ("FULL_STATE_DICT", "LOCAL_STATE_DICT", "SHARDED_STATE_DICT")
_PRECISION_DTYPES = {
    "fp8": torch.bfloat16,
    "fp16": torch.float16,
    "bf16": torch.bfloat16,
    "fp32": torch.float32,
}


def _sharding_strategy(value: Any) -> Any:
    """A `ShardingStrategy` from its name ("FULL_SHARD"), its number (1-5) or itself."""
    from torch.distributed.fsdp import ShardingStrategy

    if isinstance(value, ShardingStrategy):
        return value
    text = str(value).strip().upper()
    if text.isdigit():
        return ShardingStrategy(int(text))
    if text in SHARDING_STRATEGIES:
        return ShardingStrategy(SHARDING_STRATEGIES.index(text) + 1)
    raise ValueError(
        f"Unknown FSDP sharding strategy {value!r}: use one of {', '.join(SHARDING_STRATEGIES)}."
    )


def _backward_prefetch(value: Any) -> Any:
    from torch.distributed.fsdp import BackwardPrefetch

    if value is None or isinstance(value, BackwardPrefetch):
        return value
    text = str(value).strip().upper()
    if text == "NO_PREFETCH":
        return None
    if text.isdigit():
        return BackwardPrefetch(int(text))
    if text in BACKWARD_PREFETCH_CHOICES:
        return BackwardPrefetch[text]
    raise ValueError(
        f"Unknown FSDP backward_prefetch {value!r}: use one of {', '.join(BACKWARD_PREFETCH_CHOICES)}."
    )


def find_module_class(model: torch.nn.Module, class_name: str) -> type | None:
    """The class named `class_name` among `model`'s submodules (itself included), or None."""
    for module in model.modules():
        if type(module).__name__ == class_name:
            return type(module)
    return None


@dataclass
class FullyShardedDataParallelPlugin:
    """Settings of fully sharded data parallel training (FSDP): pass it as `Accelerator(fsdp_plugin=...)`.

    FSDP splits each parameter, gradient and optimizer state over the processes, so models too big
    for one GPU train. Fields left None come from the `FSDP_*` variables that `cadence launch --use_fsdp
    --fsdp_*` (or a config file) sets, then from the defaults below. Settings that do not exist in the
    chosen FSDP version are ignored with a logged note; contradictory ones raise ValueError.

    Args:
        fsdp_version (int | None): 2 for FSDP2 (`fully_shard`, recommended) or 1 for the older
            `FullyShardedDataParallel` wrapper (default 1, as in Accelerate). Another value raises
            ValueError.
        sharding_strategy (str | ShardingStrategy | None): FSDP1's strategy: "FULL_SHARD" (default),
            "SHARD_GRAD_OP", "NO_SHARD", "HYBRID_SHARD", "HYBRID_SHARD_ZERO2". Deprecated with FSDP2:
            use `reshard_after_forward`.
        reshard_after_forward (bool | str | None): FSDP2: free the gathered parameters after the forward
            (True, default) or keep them until the backward (False: faster, more memory). FSDP1: a
            sharding strategy name. The wrong kind for the version raises ValueError.
        backward_prefetch (str | BackwardPrefetch | None): FSDP1: when to prefetch the next parameters
            in the backward ("BACKWARD_PRE", "BACKWARD_POST"). FSDP2 always prefetches; ignored there.
        mixed_precision_policy (str | dict | MixedPrecision | MixedPrecisionPolicy | None): The dtypes
            FSDP computes and reduces in: "bf16", "fp16", "fp32", a dict of the policy's fields, or
            torch's policy object of this version. None follows the Accelerator's `mixed_precision`.
        auto_wrap_policy (str | Callable | None): Which submodules become their own FSDP unit:
            "transformer_based_wrap" (the classes of `transformer_cls_names_to_wrap`, or the model's
            `_no_split_modules`), "size_based_wrap" (modules above `min_num_params`), "no_wrap"
            (default), or a torch policy callable. An unknown name raises ValueError.
        cpu_offload (bool | CPUOffload | CPUOffloadPolicy | None): Keep parameters (and optimizer states)
            on the CPU between uses (default False).
        ignored_modules (Iterable[torch.nn.Module] | str | None): Modules FSDP leaves alone (a regular
            expression of module names as a string).
        state_dict_type (str | StateDictType | None): What `save_state` writes: "SHARDED_STATE_DICT"
            (each process its shard; FSDP2's default) or "FULL_STATE_DICT" (gathered on rank 0; FSDP1's
            default). "LOCAL_STATE_DICT" is FSDP1 only.
        state_dict_config (StateDictConfig | None): torch's options for the model's state dict; None
            offloads to the CPU (and rank 0 only for full state dicts).
        optim_state_dict_config (OptimStateDictConfig | None): The same for the optimizer.
        limit_all_gathers (bool): FSDP1: limit in-flight all-gathers to save memory (default True).
        use_orig_params (bool | None): FSDP1: keep the original parameters visible (needed for
            several optimizer parameter groups and `torch.compile`). Ignored with FSDP2.
        param_init_fn (Callable[[torch.nn.Module], None] | None): Initialise modules created on the
            meta device.
        sync_module_states (bool | None): FSDP1: broadcast rank 0's weights at wrap time (needed with
            `cpu_ram_efficient_loading`). Ignored with FSDP2.
        forward_prefetch (bool | None): FSDP1: prefetch the next all-gather in the forward. Not
            available with FSDP2 (True raises ValueError).
        activation_checkpointing (bool | None): Recompute activations in the backward instead of keeping
            them (default False).
        activation_checkpointing_offload (bool | None): FSDP2: also move the kept activations to the
            CPU; needs `activation_checkpointing` (ValueError otherwise).
        cpu_ram_efficient_loading (bool | None): Load pretrained weights on rank 0 only and send them
            to the others (transformers reads this), so a big model is not loaded once per process.
        transformer_cls_names_to_wrap (list[str] | None): Class names of the layers to wrap with
            "transformer_based_wrap" (a comma-separated string is accepted). A name missing from the
            model raises ValueError when it is prepared, listing the classes it has.
        min_num_params (int | None): The size threshold of "size_based_wrap".

    Raises:
        ValueError: An unknown name or a combination the chosen FSDP version refuses (the message says
            what to change).

    Example:
        >>> from cadence import FullyShardedDataParallelPlugin
        >>> plugin = FullyShardedDataParallelPlugin(
        ...     fsdp_version=2,
        ...     auto_wrap_policy="transformer_based_wrap",
        ...     transformer_cls_names_to_wrap=["DecoderLayer"],
        ...     activation_checkpointing=True,
        ... )
        >>> plugin.reshard_after_forward, plugin.state_dict_type.name
        (True, 'SHARDED_STATE_DICT')
    """

    fsdp_version: int = None
    sharding_strategy: Any = None
    reshard_after_forward: Any = None
    backward_prefetch: Any = None
    mixed_precision_policy: Any = None
    auto_wrap_policy: Callable | str | None = None
    cpu_offload: Any = None
    ignored_modules: Iterable[torch.nn.Module] | str | None = None
    state_dict_type: Any = None
    state_dict_config: Any = None
    optim_state_dict_config: Any = None
    limit_all_gathers: bool = True
    use_orig_params: bool | None = None
    param_init_fn: Callable[[torch.nn.Module], None] | None = None
    sync_module_states: bool | None = None
    forward_prefetch: bool = None
    activation_checkpointing: bool = None
    activation_checkpointing_offload: bool = None
    cpu_ram_efficient_loading: bool = None
    transformer_cls_names_to_wrap: list[str] | None = None
    min_num_params: int | None = None

    def __post_init__(self) -> None:
        notes: list[str] = []
        if self.fsdp_version is None:
            self.fsdp_version = int(plugin_env_text("FSDP_VERSION", "1"))
        self.fsdp_version = int(self.fsdp_version)
        if self.fsdp_version not in (1, 2):
            raise ValueError(f"fsdp_version must be 1 or 2, got {self.fsdp_version!r}.")
        v2 = self.fsdp_version == 2
        self._resolve_sharding(notes)
        if self.cpu_offload is None:
            self.cpu_offload = plugin_env_bool("FSDP_OFFLOAD_PARAMS")
        self.set_cpu_offload()
        self.validate_cpu_offload()

        if self.backward_prefetch is None:
            self.backward_prefetch = plugin_env_text("FSDP_BACKWARD_PREFETCH")
        self.backward_prefetch = _backward_prefetch(self.backward_prefetch)
        if v2 and self.backward_prefetch is not None:
            notes.append(
                "backward_prefetch does not exist in FSDP2 (it always prefetches); ignored."
            )
            self.backward_prefetch = None

        self.set_state_dict_type()
        self._resolve_auto_wrap_policy()
        self._resolve_v1_only_flags(notes)

        if self.activation_checkpointing is None:
            self.activation_checkpointing = plugin_env_bool("FSDP_ACTIVATION_CHECKPOINTING")
        if self.activation_checkpointing_offload is None:
            self.activation_checkpointing_offload = plugin_env_bool(
                "FSDP_ACTIVATION_CHECKPOINTING_OFFLOAD"
            )
        if self.activation_checkpointing_offload and not self.activation_checkpointing:
            raise ValueError(
                "activation_checkpointing_offload=True needs activation_checkpointing=True."
            )
        if self.activation_checkpointing_offload and not v2:
            raise ValueError("activation_checkpointing_offload=True needs fsdp_version=2.")

        if self.ignored_modules is None:
            self.ignored_modules = plugin_env_text("FSDP_IGNORED_MODULES")

        if self.cpu_ram_efficient_loading is None:
            self.cpu_ram_efficient_loading = plugin_env_bool("FSDP_CPU_RAM_EFFICIENT_LOADING")
        else:
            # transformers reads this variable to load weights on the main process only.
            os.environ["FSDP_CPU_RAM_EFFICIENT_LOADING"] = str(self.cpu_ram_efficient_loading)
        if not v2 and self.cpu_ram_efficient_loading and not self.sync_module_states:
            warnings.warn(
                "cpu_ram_efficient_loading needs sync_module_states: setting sync_module_states=True.",
                stacklevel=3,
            )
            self.sync_module_states = True

        if isinstance(self.mixed_precision_policy, str):
            self.set_mixed_precision(self.mixed_precision_policy, override=True)
        elif isinstance(self.mixed_precision_policy, dict):
            self.set_mixed_precision(self.mixed_precision_policy)
        if self.mixed_precision_policy is not None:
            self.validate_mixed_precision_policy()
        if notes:
            logger.warning("FSDP%d settings adjusted:\n%s", self.fsdp_version, "\n".join(notes))

    # -- resolution steps ---------------------------------------------------------------------------
    def _resolve_sharding(self, notes: list[str]) -> None:
        v2 = self.fsdp_version == 2
        if self.sharding_strategy is not None and v2:
            notes.append("sharding_strategy is deprecated: use reshard_after_forward.")
        if not v2 and self.sharding_strategy is None:
            self.sharding_strategy = plugin_env_text("FSDP_SHARDING_STRATEGY", "FULL_SHARD")
        if self.sharding_strategy is not None:
            self.sharding_strategy = _sharding_strategy(self.sharding_strategy)
        if self.reshard_after_forward is None:
            if v2 and self.sharding_strategy is not None:
                # FULL_SHARD frees parameters after forward; SHARD_GRAD_OP keeps them until backward.
                self.reshard_after_forward = self.sharding_strategy.name != "SHARD_GRAD_OP"
            elif self.sharding_strategy is None:
                self.reshard_after_forward = plugin_env_text(
                    "FSDP_RESHARD_AFTER_FORWARD", "true" if v2 else "FULL_SHARD"
                )
        if isinstance(self.reshard_after_forward, str):
            if v2:
                self.reshard_after_forward = as_bool(
                    self.reshard_after_forward, "reshard_after_forward"
                )
            else:
                self.reshard_after_forward = _sharding_strategy(self.reshard_after_forward)
        if v2 and not isinstance(self.reshard_after_forward, bool):
            raise ValueError(
                f"reshard_after_forward={self.reshard_after_forward!r} is not valid with FSDP2: "
                "pass True (free parameters after forward) or False."
            )
        if not v2 and isinstance(self.reshard_after_forward, bool):
            raise ValueError(
                f"reshard_after_forward={self.reshard_after_forward!r} is not valid with FSDP1: pass a "
                "sharding strategy name (FULL_SHARD, SHARD_GRAD_OP, NO_SHARD, HYBRID_SHARD, ...)."
            )
        if not v2 and self.reshard_after_forward is not None:
            self.sharding_strategy = self.reshard_after_forward

    def _resolve_auto_wrap_policy(self) -> None:
        from torch.distributed.fsdp.wrap import (
            size_based_auto_wrap_policy,
            transformer_auto_wrap_policy,
        )

        if self.auto_wrap_policy is None:
            self.auto_wrap_policy = plugin_env_text("FSDP_AUTO_WRAP_POLICY", "NO_WRAP")
        if not isinstance(self.auto_wrap_policy, str):
            return
        name = self.auto_wrap_policy.upper()
        if name not in AUTO_WRAP_POLICIES:
            raise ValueError(
                f"Unknown auto_wrap_policy {self.auto_wrap_policy!r}: use one of "
                f"{', '.join(p.lower() for p in AUTO_WRAP_POLICIES)} or a callable."
            )
        if name == "TRANSFORMER_BASED_WRAP":
            self.auto_wrap_policy = transformer_auto_wrap_policy
            if self.transformer_cls_names_to_wrap is None:
                self.transformer_cls_names_to_wrap = plugin_env_text("FSDP_TRANSFORMER_CLS_TO_WRAP")
            if isinstance(self.transformer_cls_names_to_wrap, str):
                self.transformer_cls_names_to_wrap = [
                    n.strip() for n in self.transformer_cls_names_to_wrap.split(",") if n.strip()
                ]
        elif name == "SIZE_BASED_WRAP":
            self.auto_wrap_policy = size_based_auto_wrap_policy
            if self.min_num_params is None:
                self.min_num_params = int(plugin_env_text("FSDP_MIN_NUM_PARAMS", "0"))
            elif not isinstance(self.min_num_params, int) or isinstance(self.min_num_params, bool):
                raise ValueError(
                    f"min_num_params must be an integer, got {self.min_num_params!r} "
                    f"({type(self.min_num_params).__name__})."
                )
        else:
            self.auto_wrap_policy = None

    def _resolve_v1_only_flags(self, notes: list[str]) -> None:
        v2 = self.fsdp_version == 2
        for name in ("use_orig_params", "sync_module_states"):
            value = getattr(self, name)
            if v2:
                if value is not None:
                    notes.append(f"{name} does not apply to FSDP2; ignored.")
                setattr(self, name, None)
            elif value is None:
                setattr(self, name, plugin_env_bool("FSDP_" + name.upper()))
        if v2:
            if self.forward_prefetch is not None and self.forward_prefetch is not False:
                raise ValueError(
                    "forward_prefetch is not available with FSDP2: leave it unset or use fsdp_version=1."
                )
            self.forward_prefetch = None
        elif self.forward_prefetch is None:
            self.forward_prefetch = plugin_env_bool("FSDP_FORWARD_PREFETCH")

    # -- public helpers (same names as the reference) -----------------------------------------------
    def set_state_dict_type(self, state_dict_type: Any = None) -> None:
        """Set `state_dict_type` and the default state-dict configurations that go with it.

        Args:
            state_dict_type (str | StateDictType | None): "FULL_STATE_DICT", "SHARDED_STATE_DICT" or
                "LOCAL_STATE_DICT" (FSDP1 only); None keeps the current one (or the `FSDP_STATE_DICT_TYPE`
                variable, else the version's default).

        Raises:
            ValueError: An unknown name, or LOCAL_STATE_DICT with FSDP2.
        """
        from torch.distributed.fsdp import (
            FullOptimStateDictConfig,
            FullStateDictConfig,
            ShardedOptimStateDictConfig,
            ShardedStateDictConfig,
            StateDictType,
        )

        if state_dict_type is not None:
            self.state_dict_type = state_dict_type
        if self.state_dict_type is None:
            default = "FULL_STATE_DICT" if self.fsdp_version == 1 else "SHARDED_STATE_DICT"
            self.state_dict_type = plugin_env_text("FSDP_STATE_DICT_TYPE", default)
        if isinstance(self.state_dict_type, str):
            text = self.state_dict_type.strip().upper()
            if text.isdigit():
                self.state_dict_type = StateDictType(int(text))
            elif text in STATE_DICT_TYPES:
                self.state_dict_type = StateDictType[text]
            else:
                raise ValueError(
                    f"Unknown state_dict_type {self.state_dict_type!r}: use one of "
                    f"{', '.join(STATE_DICT_TYPES)}."
                )
        if self.state_dict_type == StateDictType.FULL_STATE_DICT:
            if self.state_dict_config is None:
                self.state_dict_config = FullStateDictConfig(offload_to_cpu=True, rank0_only=True)
            if self.optim_state_dict_config is None:
                self.optim_state_dict_config = FullOptimStateDictConfig(
                    offload_to_cpu=True, rank0_only=True
                )
        elif self.state_dict_type == StateDictType.SHARDED_STATE_DICT:
            if self.state_dict_config is None:
                self.state_dict_config = ShardedStateDictConfig(offload_to_cpu=True)
            if self.optim_state_dict_config is None:
                self.optim_state_dict_config = ShardedOptimStateDictConfig(offload_to_cpu=True)
        if self.fsdp_version == 2 and self.state_dict_type == StateDictType.LOCAL_STATE_DICT:
            raise ValueError(
                "FSDP2 has no LOCAL_STATE_DICT: use SHARDED_STATE_DICT or FULL_STATE_DICT."
            )

    def set_auto_wrap_policy(self, model: torch.nn.Module) -> None:
        """Bind a named wrap policy to `model`: find its layer classes, or apply `min_num_params`.

        Args:
            model (torch.nn.Module): The model about to be wrapped.

        Raises:
            ValueError: A class of `transformer_cls_names_to_wrap` the model does not have.
        """
        from torch.distributed.fsdp.wrap import (
            size_based_auto_wrap_policy,
            transformer_auto_wrap_policy,
        )

        if self.auto_wrap_policy is transformer_auto_wrap_policy:
            names = self.transformer_cls_names_to_wrap
            if names is None:
                names = list(getattr(model, "_no_split_modules", None) or [])
                self.transformer_cls_names_to_wrap = names
            self.auto_wrap_policy = functools.partial(
                transformer_auto_wrap_policy,
                transformer_layer_cls=set(self.layer_classes(model)),
            )
        elif self.auto_wrap_policy is size_based_auto_wrap_policy:
            if self.min_num_params and self.min_num_params > 0:
                self.auto_wrap_policy = functools.partial(
                    size_based_auto_wrap_policy, min_num_params=self.min_num_params
                )
            else:
                self.auto_wrap_policy = None

    def layer_classes(self, model: torch.nn.Module) -> list[type]:
        """The classes named in `transformer_cls_names_to_wrap` (else the model's `_no_split_modules`), found in `model`.

        Args:
            model (torch.nn.Module): The model.

        Returns:
            list[type]: The layer classes.

        Raises:
            ValueError: A name that no module of `model` has (the message lists the classes it has).
        """
        classes = []
        names = self.transformer_cls_names_to_wrap
        if names is None:
            names = list(getattr(model, "_no_split_modules", None) or [])
        for name in names:
            cls = find_module_class(model, name)
            if cls is None:
                present = sorted({type(m).__name__ for m in model.modules()})
                raise ValueError(
                    f"{rank_prefix()}Could not find the transformer layer class {name!r} in the model "
                    f"(transformer_cls_names_to_wrap / --fsdp_transformer_layer_cls_to_wrap). Classes in "
                    f"this model: {', '.join(present)}."
                )
            classes.append(cls)
        return classes

    def set_mixed_precision(
        self, mixed_precision: Any, buffer_autocast: bool = False, override: bool = False
    ) -> None:
        """Build the FSDP mixed-precision policy from a precision name, a dtype or a dict.

        Args:
            mixed_precision (str | torch.dtype | dict): "bf16", "fp16", "fp32" or "fp8", a dtype, or a dict
                of the policy's fields.
            buffer_autocast (bool): FSDP1: keep buffers in float32 (default False).
            override (bool): Replace a policy already set (default False).

        Raises:
            ValueError: An unknown name or dtype, or a dict without the policy's fields.
        """
        if self.fsdp_version == 2:
            from torch.distributed.fsdp import MixedPrecisionPolicy as policy_class
        else:
            from torch.distributed.fsdp import MixedPrecision as policy_class
        dtype = mixed_precision
        if isinstance(mixed_precision, str):
            dtype = _PRECISION_DTYPES.get(mixed_precision)
            if dtype is None:
                raise ValueError(
                    f"Unknown mixed precision {mixed_precision!r}: use one of {', '.join(_PRECISION_DTYPES)}."
                )
        elif isinstance(mixed_precision, torch.dtype) and dtype not in _PRECISION_DTYPES.values():
            raise ValueError(
                f"Unsupported mixed precision dtype {mixed_precision}: use float32, float16 or bfloat16."
            )
        if override or self.mixed_precision_policy is None:
            args: dict[str, Any] = {"param_dtype": dtype, "reduce_dtype": dtype}
            if self.fsdp_version == 1:
                args["buffer_dtype"] = torch.float32 if buffer_autocast else dtype
            else:
                args["output_dtype"] = dtype
            self.mixed_precision_policy = policy_class(**args)
        elif isinstance(self.mixed_precision_policy, dict):
            third = "buffer_dtype" if self.fsdp_version == 1 else "output_dtype"
            expected = ["param_dtype", "reduce_dtype", third]
            given = self.mixed_precision_policy
            missing = [k for k in expected if k not in given]
            bad = [k for k, v in given.items() if v not in _PRECISION_DTYPES.values()]
            if missing or bad:
                raise ValueError(
                    f"Invalid mixed_precision_policy {given!r}: give the keys {', '.join(expected)} with "
                    "torch dtypes (torch.float32, torch.float16, torch.bfloat16)."
                )
            self.mixed_precision_policy = policy_class(**given)

    def validate_mixed_precision_policy(self) -> None:
        """Raise unless `mixed_precision_policy` is the policy class of this FSDP version."""
        if self.fsdp_version == 2:
            from torch.distributed.fsdp import MixedPrecisionPolicy as policy_class
        else:
            from torch.distributed.fsdp import MixedPrecision as policy_class
        if not isinstance(self.mixed_precision_policy, policy_class):
            raise ValueError(
                f"mixed_precision_policy must be a torch.distributed.fsdp.{policy_class.__name__} for "
                f"FSDP{self.fsdp_version}, got {type(self.mixed_precision_policy).__name__}."
            )

    def set_cpu_offload(self) -> None:
        """Turn a bool (or 'true'/'false') `cpu_offload` into this FSDP version's offload object."""
        if isinstance(self.cpu_offload, str):
            self.cpu_offload = as_bool(self.cpu_offload, "cpu_offload")
        if not isinstance(self.cpu_offload, bool):
            return
        if self.fsdp_version == 2:
            from torch.distributed.fsdp import CPUOffloadPolicy, OffloadPolicy

            self.cpu_offload = CPUOffloadPolicy() if self.cpu_offload else OffloadPolicy()
        else:
            from torch.distributed.fsdp import CPUOffload

            self.cpu_offload = CPUOffload(offload_params=self.cpu_offload)

    def validate_cpu_offload(self) -> None:
        """Raise unless `cpu_offload` is the offload class of this FSDP version."""
        if self.fsdp_version == 2:
            from torch.distributed.fsdp import OffloadPolicy

            if not isinstance(self.cpu_offload, OffloadPolicy):
                raise ValueError(
                    "cpu_offload must be a bool or a torch.distributed.fsdp.OffloadPolicy with FSDP2, "
                    f"got {self.cpu_offload!r}."
                )
        else:
            from torch.distributed.fsdp import CPUOffload

            if not isinstance(self.cpu_offload, CPUOffload):
                raise ValueError(
                    "cpu_offload must be a bool or a torch.distributed.fsdp.CPUOffload with FSDP1, "
                    f"got {self.cpu_offload!r}."
                )

    @property
    def offloads_parameters(self) -> bool:
        """Whether parameters live on the CPU between uses."""
        if self.fsdp_version == 2:
            from torch.distributed.fsdp import CPUOffloadPolicy

            return isinstance(self.cpu_offload, CPUOffloadPolicy)
        return bool(getattr(self.cpu_offload, "offload_params", False))

    @property
    def is_sharded_state_dict(self) -> bool:
        """Whether checkpoints use the sharded state dict type."""
        return getattr(self.state_dict_type, "name", None) == "SHARDED_STATE_DICT"


def fsdp_plugin_from_launch(record: dict[str, Any]) -> FullyShardedDataParallelPlugin:
    """The plugin described by the `fsdp` entry of `cadence launch`'s settings record."""
    version = int(record.get("version") or 1)
    v1 = version == 1
    kwargs: dict[str, Any] = {
        "fsdp_version": version,
        "cpu_offload": bool(record.get("offload_params", False)),
        "auto_wrap_policy": record.get("auto_wrap_policy") or "NO_WRAP",
        "transformer_cls_names_to_wrap": record.get("transformer_layer_cls_to_wrap"),
        "min_num_params": record.get("min_num_params"),
        "state_dict_type": record.get("state_dict_type"),
        "activation_checkpointing": bool(record.get("activation_checkpointing", False)),
        "activation_checkpointing_offload": bool(
            record.get("activation_checkpointing_offload", False)
        ),
        "cpu_ram_efficient_loading": bool(record.get("cpu_ram_efficient_loading", False)),
    }
    if kwargs["min_num_params"] is not None:
        kwargs["min_num_params"] = int(kwargs["min_num_params"])
    if v1:
        kwargs["sharding_strategy"] = record.get("sharding_strategy") or "FULL_SHARD"
        kwargs["backward_prefetch"] = record.get("backward_prefetch")
        kwargs["forward_prefetch"] = bool(record.get("forward_prefetch", False))
        kwargs["use_orig_params"] = bool(record.get("use_orig_params", False))
        kwargs["sync_module_states"] = bool(record.get("sync_module_states", False))
    else:
        kwargs["reshard_after_forward"] = str(record.get("reshard_after_forward", "true"))
    return FullyShardedDataParallelPlugin(**kwargs)


def check_fsdp1_supported(plugin: Any, device: torch.device, rank: int = 0) -> None:
    """Refuse FSDP1 settings that cannot run on `device`, before any process group work."""
    if device.type == "cpu" and plugin.offloads_parameters:
        raise ValueError(
            f"[rank {rank}] FSDP1 CPU offload (cpu_offload=True / --fsdp_offload_params true) does not work "
            "when training on the CPU: the parameters already live there, and FSDP1's offload path "
            "needs a GPU. Turn offload off, or use FSDP2 (fsdp_version=2), whose CPUOffloadPolicy "
            "works on the CPU."
        )
