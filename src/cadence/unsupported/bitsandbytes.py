"""bitsandbytes quantization names: `BnbQuantizationConfig` validates for real; loading and
quantizing a model raises, since Cadence does not drive bitsandbytes."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from . import unsupported

FEATURE = "bitsandbytes quantized model loading"
INSTEAD = (
    "Load the quantized model with Transformers' `from_pretrained(..., quantization_config=...)`."
)
_DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


@dataclass
class BnbQuantizationConfig:
    """How bitsandbytes would quantize a model (8-bit or 4-bit); validated on creation.

    Attributes:
        load_in_8bit (bool): Quantize linear layers to 8 bits (LLM.int8()).
        llm_int8_threshold (float): The outlier threshold of LLM.int8() (default 6.0).
        load_in_4bit (bool): Quantize linear layers to 4 bits.
        bnb_4bit_quant_type (str): The 4-bit data type, "fp4" or "nf4".
        bnb_4bit_use_double_quant (bool): Also quantize the quantization constants.
        bnb_4bit_compute_dtype (Any): The dtype 4-bit layers compute in: "fp32", "fp16" or "bf16".
        torch_dtype (Any): The dtype of the layers left unquantized (None: fp16 with 8 bits, fp32
            with 4).
        skip_modules (Any): Names of modules not to quantize.
        keep_in_fp32_modules (Any): Names of modules kept in fp32.

    Raises:
        ValueError: Both or neither of `load_in_8bit` and `load_in_4bit`, or an unknown 4-bit type
            or compute dtype.
    """

    load_in_8bit: bool = field(
        default=False, metadata={"help": "Quantize linear layers to 8 bits."}
    )
    llm_int8_threshold: float = field(
        default=6.0, metadata={"help": "Outlier threshold of LLM.int8()."}
    )
    load_in_4bit: bool = field(
        default=False, metadata={"help": "Quantize linear layers to 4 bits."}
    )
    bnb_4bit_quant_type: str = field(default="fp4", metadata={"help": "'fp4' or 'nf4'."})
    bnb_4bit_use_double_quant: bool = field(
        default=False, metadata={"help": "Quantize the quantization constants."}
    )
    bnb_4bit_compute_dtype: Any = field(
        default="fp16", metadata={"help": "'fp32', 'fp16' or 'bf16'."}
    )
    torch_dtype: Any = field(
        default=None, metadata={"help": "dtype of the layers kept unquantized."}
    )
    skip_modules: Any = field(default=None, metadata={"help": "Module names not to quantize."})
    keep_in_fp32_modules: Any = field(default=None, metadata={"help": "Module names kept in fp32."})

    def __post_init__(self) -> None:
        if self.load_in_8bit and self.load_in_4bit:
            raise ValueError("load_in_8bit and load_in_4bit can't be both True")
        if not (self.load_in_8bit or self.load_in_4bit):
            raise ValueError("load_in_8bit and load_in_4bit can't be both False")
        if self.bnb_4bit_quant_type not in ("fp4", "nf4"):
            raise ValueError(
                f"bnb_4bit_quant_type must be 'fp4' or 'nf4', got {self.bnb_4bit_quant_type!r}"
            )
        if isinstance(self.bnb_4bit_compute_dtype, str):
            if self.bnb_4bit_compute_dtype not in _DTYPES:
                raise ValueError("bnb_4bit_compute_dtype must be in ['fp32','fp16','bf16']")
            self.bnb_4bit_compute_dtype = _DTYPES[self.bnb_4bit_compute_dtype]
        self.skip_modules = list(self.skip_modules or [])
        self.keep_in_fp32_modules = list(self.keep_in_fp32_modules or [])
        if self.torch_dtype is None:
            self.torch_dtype = torch.float16 if self.load_in_8bit else torch.float32


def has_4bit_bnb_layers(model: torch.nn.Module) -> bool:
    """Whether `model` holds bitsandbytes 4-bit linear layers (False when bitsandbytes is absent).

    Args:
        model (torch.nn.Module): The model to inspect.

    Returns:
        bool: True when some module is a `Linear4bit`.
    """
    return any(type(module).__name__ == "Linear4bit" for module in model.modules())


def get_parameter_device(parameter: torch.nn.Module) -> torch.device:
    """The device of the first parameter of a module.

    Args:
        parameter (torch.nn.Module): A module with at least one parameter.

    Returns:
        torch.device: The device.
    """
    return next(parameter.parameters()).device


def get_keys_to_not_convert(model: torch.nn.Module) -> list[str]:
    """Modules that must stay unquantized (unsupported: needs the bitsandbytes integration).

    Args:
        model (torch.nn.Module): The model.

    Raises:
        UnsupportedFeatureError: Always (a `NotImplementedError`): bitsandbytes quantization is not supported.
    """
    return unsupported("get_keys_to_not_convert", FEATURE, INSTEAD)


def get_quantized_model_device_map(
    model: Any,
    bnb_quantization_config: Any,
    device_map: Any = None,
    max_memory: Any = None,
    no_split_module_classes: Any = None,
) -> Any:
    """Device map of a quantized model (unsupported).

    Args:
        model (Any): The model.
        bnb_quantization_config (Any): The quantization settings.
        device_map (Any): A device map, or "auto"-style strategy.
        max_memory (Any): Memory allowed per device.
        no_split_module_classes (Any): Class names of modules that must stay whole.

    Raises:
        UnsupportedFeatureError: Always (a `NotImplementedError`): bitsandbytes quantization is not supported.
    """
    return unsupported("get_quantized_model_device_map", FEATURE, INSTEAD)


def load_and_quantize_model(
    model: torch.nn.Module,
    bnb_quantization_config: BnbQuantizationConfig,
    weights_location: Any = None,
    device_map: Any = None,
    no_split_module_classes: Any = None,
    max_memory: Any = None,
    offload_folder: Any = None,
    offload_state_dict: bool = False,
) -> torch.nn.Module:
    """Quantize a model with bitsandbytes and load its weights (unsupported).

    Args:
        model (torch.nn.Module): The model (usually on the meta device).
        bnb_quantization_config (BnbQuantizationConfig): The quantization settings.
        weights_location (Any): The checkpoint to load.
        device_map (Any): Where each module goes.
        no_split_module_classes (Any): Class names of modules that must stay whole.
        max_memory (Any): Memory allowed per device.
        offload_folder (Any): Where offloaded weights go.
        offload_state_dict (bool): Offload the state dict to disk while loading.

    Raises:
        UnsupportedFeatureError: Always (a `NotImplementedError`): bitsandbytes quantization is not supported.
    """
    return unsupported("load_and_quantize_model", FEATURE, INSTEAD)


def quantize_and_offload_8bit(
    model: Any,
    param: Any,
    param_name: Any,
    new_dtype: Any,
    offload_folder: Any,
    offload_index: Any,
    fp16_statistics: Any,
) -> None:
    """Quantize one parameter to 8 bits and offload it (unsupported).

    Args:
        model (Any): The model.
        param (Any): The parameter's value.
        param_name (Any): Its name.
        new_dtype (Any): The dtype to load it in.
        offload_folder (Any): Where it is offloaded.
        offload_index (Any): The offload index to update.
        fp16_statistics (Any): LLM.int8()'s statistics for it.

    Raises:
        UnsupportedFeatureError: Always (a `NotImplementedError`): bitsandbytes quantization is not supported.
    """
    unsupported("quantize_and_offload_8bit", FEATURE, INSTEAD)


def replace_with_bnb_layers(
    model: Any,
    bnb_quantization_config: Any,
    modules_to_not_convert: Any = None,
    current_key_name: Any = None,
) -> Any:
    """Swap linear layers for bitsandbytes layers (unsupported).

    Args:
        model (Any): The model.
        bnb_quantization_config (Any): The quantization settings.
        modules_to_not_convert (Any): Module names left as they are.
        current_key_name (Any): The path of the module being visited.

    Raises:
        UnsupportedFeatureError: Always (a `NotImplementedError`): bitsandbytes quantization is not supported.
    """
    return unsupported("replace_with_bnb_layers", FEATURE, INSTEAD)
