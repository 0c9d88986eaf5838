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
    """How bitsandbytes would quantize a model (8-bit or 4-bit); validated on creation."""

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
    """Whether `model` holds bitsandbytes 4-bit linear layers (False when bitsandbytes is absent)."""
    return any(type(module).__name__ == "Linear4bit" for module in model.modules())


def get_parameter_device(parameter: torch.nn.Module) -> torch.device:
    """The device of the first parameter of a module."""
    return next(parameter.parameters()).device


def get_keys_to_not_convert(model: torch.nn.Module) -> list[str]:
    """Modules that must stay unquantized (unsupported: needs the bitsandbytes integration)."""
    return unsupported("get_keys_to_not_convert", FEATURE, INSTEAD)


def get_quantized_model_device_map(
    model: Any,
    bnb_quantization_config: Any,
    device_map: Any = None,
    max_memory: Any = None,
    no_split_module_classes: Any = None,
) -> Any:
    """Device map of a quantized model (unsupported)."""
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
    """Quantize a model with bitsandbytes and load its weights (unsupported)."""
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
    """Quantize one parameter to 8 bits and offload it (unsupported)."""
    unsupported("quantize_and_offload_8bit", FEATURE, INSTEAD)


def replace_with_bnb_layers(
    model: Any,
    bnb_quantization_config: Any,
    modules_to_not_convert: Any = None,
    current_key_name: Any = None,
) -> Any:
    """Swap linear layers for bitsandbytes layers (unsupported)."""
    return unsupported("replace_with_bnb_layers", FEATURE, INSTEAD)
