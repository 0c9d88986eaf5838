"""DeepSpeedPlugin: the DeepSpeed (ZeRO) settings, as plugin fields or a DeepSpeed JSON config.

`"auto"` values in a user's config are filled from the plugin, the Accelerator and the dataloaders when
`prepare` builds the engine. Nothing here imports `deepspeed`: the plugin can be built (and checked)
without it; the engine needs it.
"""

from __future__ import annotations

import copy
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Literal

from ..core.settings import parse_bool as as_bool
from ..core.settings import plugin_env_bool, plugin_env_text
from .deepspeed_config import DeepSpeedConfig as DeepSpeedConfig
from .fsdp import find_module_class

# Plugin field -> dotted key of the DeepSpeed config that it mirrors.
PLUGIN_TO_CONFIG = {
    "gradient_accumulation_steps": "gradient_accumulation_steps",
    "gradient_clipping": "gradient_clipping",
    "zero_stage": "zero_optimization.stage",
    "offload_optimizer_device": "zero_optimization.offload_optimizer.device",
    "offload_param_device": "zero_optimization.offload_param.device",
    "offload_param_nvme_path": "zero_optimization.offload_param.nvme_path",
    "offload_optimizer_nvme_path": "zero_optimization.offload_optimizer.nvme_path",
    "zero3_save_16bit_model": "zero_optimization.stage3_gather_16bit_weights_on_model_save",
}
# Launcher settings that a DeepSpeed config file overrides: setting both is ambiguous.
FIELDS_OWNED_BY_CONFIG_FILE = (
    "gradient_accumulation_steps",
    "gradient_clipping",
    "zero_stage",
    "offload_optimizer_device",
    "offload_param_device",
    "offload_param_nvme_path",
    "offload_optimizer_nvme_path",
    "zero3_save_16bit_model",
    "mixed_precision",
)


def deepspeed_missing_error(what: str = "DeepSpeed") -> ImportError:
    """The ImportError to raise when `what` needs DeepSpeed and it is not installed."""
    return ImportError(
        f"{what} needs the `deepspeed` package, which is not installed: `pip install cadence[deepspeed]` "
        "(or `pip install deepspeed`), or train with FSDP / DDP instead."
    )


@dataclass
class DeepSpeedPlugin:
    """DeepSpeed settings: pass it as `Accelerator(deepspeed_plugin=...)`, or several by name in a dict.

    Either give a DeepSpeed config (`hf_ds_config`: a JSON file or a dict) or let the fields below build
    one. "auto" values of a config are filled in at `prepare()` from the prepared objects (batch size,
    optimizer, scheduler) and the Accelerator's settings. Fields left None come from the `ACCELERATE_*`
    variables that `cadence launch --use_deepspeed --zero_stage ...` sets, then from the defaults below.
    Needs the `deepspeed` package. Refused on XLA devices.

    Args:
        hf_ds_config (str | dict | HfDeepSpeedConfig | None): A DeepSpeed config: a path to its JSON
            file, a dict or an `HfDeepSpeedConfig`. It must have a `zero_optimization` section
            (ValueError otherwise). None builds one from the fields.
        gradient_accumulation_steps (int | str | None): Micro-batches per optimizer step, or "auto"
            (default: the Accelerator's `gradient_accumulation_steps`).
        gradient_clipping (float | str | None): The gradient-norm clip, or "auto" (0 turns clipping off).
        zero_stage (int | None): The ZeRO stage: 0, 1, 2 (default) or 3. Another value raises
            ValueError.
        is_train_batch_min (bool): With several dataloaders, take the smallest batch size as the train
            batch size (default True).
        offload_optimizer_device (str | None): Where optimizer states live: "none" (default), "cpu" or
            "nvme" (ZeRO 2 and 3).
        offload_param_device (str | None): Where parameters live: "none" (default), "cpu" or "nvme"
            (ZeRO 3 only; another stage raises ValueError).
        offload_optimizer_nvme_path (str | None): The NVMe folder for optimizer states.
        offload_param_nvme_path (str | None): The NVMe folder for parameters.
        zero3_init_flag (bool | None): Build models directly partitioned (`deepspeed.zero.Init`) so a
            model bigger than one process's memory can be created (ZeRO 3 only: elsewhere it warns and
            is turned off). None: True with ZeRO 3.
        zero3_save_16bit_model (bool | None): With ZeRO 3, gather a 16-bit copy of the weights when the
            model is saved (default False).
        transformer_moe_cls_names (str | None): Comma-separated class names of mixture-of-experts layers,
            made ZeRO-3 leaf modules.
        enable_msamp (bool | None): FP8 training with MS-AMP through DeepSpeed (not with ZeRO 3:
            NotImplementedError). None: True when `ACCELERATE_FP8_BACKEND=MSAMP`.
        msamp_opt_level (str | None): MS-AMP's level, "O1" (default) or "O2"; another value raises
            ValueError.

    Raises:
        ValueError: A config without `zero_optimization`, a bad stage, or offload options the stage
            does not allow.
        NotImplementedError: MS-AMP with ZeRO 3.

    Example::

        from cadence import Accelerator, DeepSpeedPlugin

        plugin = DeepSpeedPlugin(zero_stage=2, gradient_accumulation_steps=2, gradient_clipping=1.0)
        accelerator = Accelerator(mixed_precision="bf16", deepspeed_plugin=plugin)
        model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    """

    hf_ds_config: Any = None
    gradient_accumulation_steps: int = None
    gradient_clipping: float = None
    zero_stage: int = None
    is_train_batch_min: bool = True
    offload_optimizer_device: str = None
    offload_param_device: str = None
    offload_optimizer_nvme_path: str = None
    offload_param_nvme_path: str = None
    zero3_init_flag: bool = None
    zero3_save_16bit_model: bool = None
    transformer_moe_cls_names: str = None
    enable_msamp: bool = None
    msamp_opt_level: Literal["O1", "O2"] | None = None

    def __post_init__(self) -> None:
        if self.gradient_accumulation_steps is None:
            raw = plugin_env_text("ACCELERATE_GRADIENT_ACCUMULATION_STEPS", "auto")
            self.gradient_accumulation_steps = int(raw) if raw.isdigit() else raw
        if self.gradient_clipping is None:
            raw = plugin_env_text("ACCELERATE_GRADIENT_CLIPPING", "auto")
            self.gradient_clipping = raw if raw == "auto" else float(raw)
        if self.zero_stage is None:
            self.zero_stage = int(plugin_env_text("ACCELERATE_DEEPSPEED_ZERO_STAGE", "2"))
        if self.offload_optimizer_device is None:
            self.offload_optimizer_device = plugin_env_text(
                "ACCELERATE_DEEPSPEED_OFFLOAD_OPTIMIZER_DEVICE", "none"
            )
        if self.offload_param_device is None:
            self.offload_param_device = plugin_env_text(
                "ACCELERATE_DEEPSPEED_OFFLOAD_PARAM_DEVICE", "none"
            )
        if self.offload_optimizer_nvme_path is None:
            self.offload_optimizer_nvme_path = plugin_env_text(
                "ACCELERATE_DEEPSPEED_OFFLOAD_OPTIMIZER_NVME_PATH", "none"
            )
        if self.offload_param_nvme_path is None:
            self.offload_param_nvme_path = plugin_env_text(
                "ACCELERATE_DEEPSPEED_OFFLOAD_PARAM_NVME_PATH", "none"
            )
        if self.zero3_save_16bit_model is None:
            self.zero3_save_16bit_model = plugin_env_bool(
                "ACCELERATE_DEEPSPEED_ZERO3_SAVE_16BIT_MODEL"
            )
        if self.enable_msamp is None:
            self.enable_msamp = plugin_env_text("ACCELERATE_FP8_BACKEND") == "MSAMP"
        if self.msamp_opt_level is None:
            self.msamp_opt_level = plugin_env_text("ACCELERATE_FP8_OPT_LEVEL", "O1")
        if self.hf_ds_config is None:
            self.hf_ds_config = plugin_env_text("ACCELERATE_DEEPSPEED_CONFIG_FILE", "none")

        given = self.hf_ds_config
        if isinstance(given, (dict, DeepSpeedConfig)) or (
            isinstance(given, str) and given != "none"
        ):
            self._adopt_user_config(given)
        else:
            self.hf_ds_config = DeepSpeedConfig(self._config_from_fields())
        self.deepspeed_config = self.hf_ds_config.config
        self.deepspeed_config["steps_per_print"] = float("inf")  # keep DeepSpeed quiet on stdout
        if self.zero3_init_flag is None:
            raw = plugin_env_text(
                "ACCELERATE_DEEPSPEED_ZERO3_INIT", str(self.hf_ds_config.is_zero3())
            )
            self.zero3_init_flag = as_bool(raw, "ACCELERATE_DEEPSPEED_ZERO3_INIT")
        if self.zero3_init_flag and not self.hf_ds_config.is_zero3():
            warnings.warn(
                "zero3_init_flag only applies to ZeRO stage 3; setting it to False.", stacklevel=3
            )
            self.zero3_init_flag = False
        self._selected = False
        if self.enable_msamp and "msamp" not in self.deepspeed_config:
            if self.zero_stage == 3:
                raise NotImplementedError(
                    "MS-AMP does not support ZeRO stage 3: use stage 0, 1 or 2."
                )
            if self.msamp_opt_level not in ("O1", "O2"):
                raise ValueError(
                    f"msamp_opt_level must be 'O1' or 'O2', got {self.msamp_opt_level!r}."
                )
            self.deepspeed_config["msamp"] = {"enabled": True, "opt_level": self.msamp_opt_level}
        self._check_zero_options()

    def _adopt_user_config(self, given: Any) -> None:
        config = given if isinstance(given, DeepSpeedConfig) else DeepSpeedConfig(given)
        self.hf_ds_config = config
        config.config.setdefault("gradient_accumulation_steps", 1)
        if "zero_optimization" not in config.config:
            raise ValueError(
                "The DeepSpeed config has no `zero_optimization` section: add one (e.g. "
                '{"zero_optimization": {"stage": 2}}).'
            )
        values = {key: getattr(self, field) for field, key in PLUGIN_TO_CONFIG.items()}
        values = {k: v for k, v in values.items() if v is not None}
        for key in values:
            self.fill_match(key, must_match=False, **values)
        config.set_stage_and_offload()
        for field, key in PLUGIN_TO_CONFIG.items():
            value = config.get_value(key)
            if value is not None and value != "auto":
                setattr(self, field, value)

    def _config_from_fields(self) -> dict[str, Any]:
        config: dict[str, Any] = {
            "train_batch_size": "auto",
            "train_micro_batch_size_per_gpu": "auto",
            "gradient_accumulation_steps": self.gradient_accumulation_steps,
            "zero_optimization": {
                "stage": self.zero_stage,
                "offload_optimizer": {
                    "device": self.offload_optimizer_device,
                    "nvme_path": self.offload_optimizer_nvme_path
                    if self.offload_optimizer_device == "nvme"
                    else None,
                },
                "offload_param": {
                    "device": self.offload_param_device,
                    "nvme_path": self.offload_param_nvme_path
                    if self.offload_param_device == "nvme"
                    else None,
                },
                "stage3_gather_16bit_weights_on_model_save": self.zero3_save_16bit_model,
            },
        }
        if self.gradient_clipping is not None:
            # Written even when 0: DeepSpeed's own default clips at 1.0, so 0 must be explicit to mean off.
            config["gradient_clipping"] = self.gradient_clipping
        return config

    def _check_zero_options(self) -> None:
        stage = self.hf_ds_config.get_value("zero_optimization.stage")
        if stage not in (None, 0, 1, 2, 3, "auto"):  # None: DeepSpeed's default, stage 0
            raise ValueError(f"DeepSpeed zero_stage must be 0, 1, 2 or 3, got {stage!r}.")
        param_device = str(
            self.hf_ds_config.get_value("zero_optimization.offload_param.device", "none")
        )
        if param_device not in ("none", "None") and stage != 3:
            raise ValueError(
                f"offload_param_device={param_device!r} needs ZeRO stage 3 (parameters are only partitioned "
                f"at stage 3); this config uses stage {stage}. Use zero_stage=3 or offload_param_device='none'."
            )
        optimizer_device = str(
            self.hf_ds_config.get_value("zero_optimization.offload_optimizer.device", "none")
        )
        if optimizer_device not in ("none", "None") and stage in (0,):
            raise ValueError(
                f"offload_optimizer_device={optimizer_device!r} needs ZeRO stage 1, 2 or 3; this config uses "
                "stage 0."
            )
        for kind, device in (("param", param_device), ("optimizer", optimizer_device)):
            path = self.hf_ds_config.get_value(f"zero_optimization.offload_{kind}.nvme_path")
            if device == "nvme" and path in (None, "none", "None", ""):
                raise ValueError(
                    f"offload_{kind}_device='nvme' needs offload_{kind}_nvme_path (a folder on an NVMe "
                    "drive)."
                )

    # -- "auto" filling ---------------------------------------------------------------------------
    def fill_match(
        self,
        ds_key_long: str,
        mismatches: list[str] | None = None,
        must_match: bool = True,
        **kwargs: Any,
    ) -> None:
        """Replace an "auto" value of the config by the value given for it; record a mismatch when the config holds another value.

        Args:
            ds_key_long (str): The dotted key in the config ("zero_optimization.stage").
            mismatches (list | None): Where mismatches are recorded.
            must_match (bool): Record a mismatch when the config's value differs (default True).
            **kwargs: Dotted keys to the values to fill in.
        """
        mismatches = [] if mismatches is None else mismatches
        node, key = self.hf_ds_config.find_config_node(ds_key_long)
        if node is None:
            return
        if node.get(key) == "auto":
            if ds_key_long not in kwargs:
                raise ValueError(
                    f"`{ds_key_long}` is 'auto' in the DeepSpeed config but Cadence cannot fill it here: set "
                    "it to a value in the config."
                )
            node[key] = kwargs[ds_key_long]
            return
        if not must_match:
            return
        value = node.get(key)
        if value is not None and ds_key_long in kwargs and value != kwargs[ds_key_long]:
            mismatches.append(
                f"- ds {ds_key_long}={value} vs arg {ds_key_long}={kwargs[ds_key_long]}"
            )

    def is_auto(self, ds_key_long: str) -> bool:
        """Whether the config's value at `ds_key_long` is "auto".

        Args:
            ds_key_long (str): The dotted key.

        Returns:
            bool: True for "auto".
        """
        value = self.hf_ds_config.get_value(ds_key_long)
        return value is not None and value == "auto"

    def get_value(self, ds_key_long: str, default: Any = None) -> Any:
        """The config's value at the dotted key `ds_key_long`, or `default`.

        Args:
            ds_key_long (str): The dotted key ("optimizer.params.lr").
            default (Any): What to return when the key is absent.

        Returns:
            Any: The value.
        """
        return self.hf_ds_config.get_value(ds_key_long, default)

    def deepspeed_config_process(
        self,
        prefix: str = "",
        mismatches: list[str] | None = None,
        config: dict | None = None,
        must_match: bool = True,
        **kwargs: Any,
    ) -> None:
        """Fill every "auto" value of the config from `kwargs`; raise when given values contradict the config.

        Args:
            prefix (str): The dotted prefix of the sub-tree being processed ("" for the whole config).
            mismatches (list | None): Where mismatches are collected.
            config (dict | None): The sub-tree; None means the whole config.
            must_match (bool): Treat a value that differs from the config as an error (default True).
            **kwargs: Dotted keys to values.

        Raises:
            ValueError: The config and the given values disagree (the message lists each key).
        """
        mismatches = [] if mismatches is None else mismatches
        config = self.deepspeed_config if config is None else config
        for key, value in config.items():
            if isinstance(value, dict):
                self.deepspeed_config_process(
                    prefix=prefix + key + ".",
                    mismatches=mismatches,
                    config=value,
                    must_match=must_match,
                    **kwargs,
                )
            else:
                self.fill_match(prefix + key, mismatches, must_match=must_match, **kwargs)
        if mismatches and prefix == "":
            raise ValueError(
                "These DeepSpeed config values do not match the Accelerator's:\n"
                + "\n".join(mismatches)
                + "\nSet them to 'auto' in the DeepSpeed config to take the Accelerator's values."
            )

    def check_mixed_precision(self, mixed_precision: str) -> None:
        """Raise when the config enables the other half precision than `mixed_precision`.

        Args:
            mixed_precision (str): The Accelerator's precision ("no", "fp16", "bf16", "fp8").

        Raises:
            ValueError: The config enables fp16 while bf16 is asked for, or the reverse.
        """
        if mixed_precision == "no":
            return
        other = "bf16" if mixed_precision == "fp16" else "fp16"
        enabled = self.deepspeed_config.get(other, {}).get("enabled", "False")
        if str(enabled).lower() == "true":
            raise ValueError(
                f"mixed_precision={mixed_precision!r} conflicts with `{other}` enabled in the DeepSpeed "
                "config: choose one."
            )

    def set_mixed_precision(self, mixed_precision: str) -> None:
        """Turn on the config's fp16 or bf16 section to match the Accelerator's precision.

        Args:
            mixed_precision (str): "no", "fp16", "bf16" or "fp8".

        Raises:
            ValueError: The config enables the other half precision.
        """
        self.check_mixed_precision(mixed_precision)
        self.enable_mixed_precision(mixed_precision)

    def enable_mixed_precision(self, mixed_precision: str) -> None:
        """Like `set_mixed_precision`, for a precision already checked against this config.

        Args:
            mixed_precision (str): "no", "fp16", "bf16" or "fp8".
        """
        config = self.deepspeed_config
        enabled = {
            "fp16.enabled": mixed_precision == "fp16",
            "bf16.enabled": mixed_precision in ("bf16", "fp8"),
        }
        if mixed_precision == "fp16" and "fp16" not in config:
            config["fp16"] = {"enabled": True, "auto_cast": True}
        elif mixed_precision in ("bf16", "fp8") and "bf16" not in config:
            config["bf16"] = {"enabled": True}
        if mixed_precision == "fp8" and self.enable_msamp and "msamp" not in config:
            config["msamp"] = {"enabled": True, "opt_level": self.msamp_opt_level}
        for dtype in ("fp16", "bf16"):
            config.setdefault(dtype, {"enabled": False})
        self.fill_match("fp16.enabled", must_match=False, **enabled)
        self.fill_match("bf16.enabled", must_match=False, **enabled)

    # -- ZeRO-3 init, selection -------------------------------------------------------------------
    def set_deepspeed_weakref(self) -> None:
        """Tell transformers (if installed) about this config, so `from_pretrained` can use zero.Init."""
        try:
            from transformers.integrations import HfDeepSpeedConfig, unset_hf_deepspeed_config
        except ImportError:
            if self.zero3_init_flag:
                raise ImportError(
                    "zero3_init_flag=True needs transformers (`pip install transformers`)."
                ) from None
            return
        config = copy.deepcopy(self.deepspeed_config)
        if config.get("gradient_accumulation_steps", "auto") == "auto":
            config["gradient_accumulation_steps"] = 1
        if config.get("train_micro_batch_size_per_gpu", "auto") == "auto":
            config["train_micro_batch_size_per_gpu"] = 1
        if config.get("train_batch_size") == "auto":
            del config["train_batch_size"]
        unset_hf_deepspeed_config()
        self.dschf = HfDeepSpeedConfig(config)

    def is_zero3_init_enabled(self) -> bool:
        """Whether models are built directly partitioned (ZeRO-3 `zero.Init`)."""
        return bool(self.zero3_init_flag)

    @contextmanager
    def zero3_init_context_manager(self, enable: bool = False) -> Iterator[None]:
        """Turn ZeRO-3's partitioned model creation (`deepspeed.zero.Init`) on or off inside the block.

        Args:
            enable (bool): On (True) or off (False, the default: for a model that must be built whole).
        """
        previous = self.zero3_init_flag
        if previous == enable:
            yield
            return
        self.zero3_init_flag = enable
        self.dschf = None
        self.set_deepspeed_weakref()
        try:
            yield
        finally:
            self.zero3_init_flag = previous
            self.dschf = None
            self.set_deepspeed_weakref()

    def set_moe_leaf_modules(self, model: Any) -> None:
        """Make the mixture-of-experts layer classes of `transformer_moe_cls_names` ZeRO-3 leaf modules.

        Args:
            model (torch.nn.Module): The model.

        Raises:
            ValueError: A class name the model does not have.
        """
        if self.transformer_moe_cls_names is None:
            self.transformer_moe_cls_names = plugin_env_text(
                "ACCELERATE_DEEPSPEED_MOE_LAYER_CLS_NAMES"
            )
        if self.transformer_moe_cls_names is None:
            return
        from deepspeed.utils import set_z3_leaf_modules

        classes = []
        for name in self.transformer_moe_cls_names.split(","):
            cls = find_module_class(model, name.strip())
            if cls is None:
                raise ValueError(f"Could not find a MoE layer class called {name!r} in the model.")
            classes.append(cls)
        set_z3_leaf_modules(model, classes)

    def select(self, _from_accelerator_state: bool = False) -> None:
        """Mark this plugin active; only `AcceleratorState.select_deepspeed_plugin` may call it."""
        if not _from_accelerator_state:
            raise ValueError(
                "Activate a DeepSpeedPlugin with AcceleratorState().select_deepspeed_plugin(name)."
            )
        self._selected = True

    def _unselect(self) -> None:
        self._selected = False

    @property
    def selected(self) -> bool:
        """Whether this plugin is the active one among several named plugins."""
        return self._selected

    @selected.setter
    def selected(self, value: bool) -> None:
        """Refuse direct assignment: use `AcceleratorState().select_deepspeed_plugin(name)`."""
        raise NotImplementedError(
            "`selected` is set through AcceleratorState().select_deepspeed_plugin(name)."
        )


class DummyOptim:
    """Stands for the optimizer defined in the DeepSpeed config (its `params`, `lr`, `weight_decay`).

    Args:
        params (Any): The model's parameters (or parameter groups).
        lr (float): The learning rate, filling the config's "auto" value (default 0.001).
        weight_decay (float): The weight decay, filling the config's "auto" value (default 0).
        **kwargs: Other optimizer settings, kept in `kwargs`.
    """

    def __init__(
        self, params: Any, lr: float = 0.001, weight_decay: float = 0, **kwargs: Any
    ) -> None:
        self.params = params
        self.lr = lr
        self.weight_decay = weight_decay
        self.kwargs = kwargs


class DummyScheduler:
    """Stands for the scheduler defined in the DeepSpeed config (or built by `lr_scheduler_callable`).

    Args:
        optimizer (Any): The optimizer it schedules (usually a `DummyOptim`).
        total_num_steps (int | None): The number of training steps, filling the config's "auto" value.
        warmup_num_steps (int): The number of warm-up steps (default 0).
        lr_scheduler_callable (Any): Builds the scheduler from the optimizer DeepSpeed creates, when the
            config defines none.
        **kwargs: Other scheduler settings, kept in `kwargs`.
    """

    def __init__(
        self,
        optimizer: Any,
        total_num_steps: int | None = None,
        warmup_num_steps: int = 0,
        lr_scheduler_callable: Any = None,
        **kwargs: Any,
    ) -> None:
        self.optimizer = optimizer
        self.total_num_steps = total_num_steps
        self.warmup_num_steps = warmup_num_steps
        self.lr_scheduler_callable = lr_scheduler_callable
        self.kwargs = kwargs


def deepspeed_plugin_from_launch(record: dict[str, Any]) -> DeepSpeedPlugin:
    """The plugin described by the `deepspeed` entry of `cadence launch`'s settings record."""
    config_file = record.get("deepspeed_config_file")
    if config_file:
        clashing = [
            f for f in record.get("fields_from_config", []) if f in FIELDS_OWNED_BY_CONFIG_FILE
        ]
        if clashing:
            raise ValueError(
                f"With a DeepSpeed config file ({config_file}), set these in that file instead of the cadence "
                f"config: {', '.join(clashing)}."
            )
        return DeepSpeedPlugin(
            hf_ds_config=config_file, zero3_init_flag=record.get("zero3_init_flag")
        )
    kwargs: dict[str, Any] = {
        "zero_stage": record.get("zero_stage", 2),
        "offload_optimizer_device": record.get("offload_optimizer_device") or "none",
        "offload_param_device": record.get("offload_param_device") or "none",
        "offload_optimizer_nvme_path": record.get("offload_optimizer_nvme_path") or "none",
        "offload_param_nvme_path": record.get("offload_param_nvme_path") or "none",
        "zero3_init_flag": record.get("zero3_init_flag"),
        "zero3_save_16bit_model": record.get("zero3_save_16bit_model"),
        "transformer_moe_cls_names": record.get("deepspeed_moe_layer_cls_names"),
    }
    if record.get("gradient_clipping") is not None:
        kwargs["gradient_clipping"] = float(record["gradient_clipping"])
    return DeepSpeedPlugin(**kwargs)
