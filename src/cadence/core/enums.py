"""String enums of the public API (values match Accelerate's)."""

from __future__ import annotations

import enum


class EnumWithContains(enum.EnumMeta):
    """Enum metaclass whose `in` accepts values too: `"fp16" in PrecisionType` is True."""

    def __contains__(cls, item: object) -> bool:
        try:
            cls(item)
        except (ValueError, TypeError):
            return False
        return True


class BaseEnum(enum.Enum, metaclass=EnumWithContains):
    """An enum that prints as its value, lists its values, and accepts values with `in`."""

    def __str__(self) -> str:
        return str(self.value)

    @classmethod
    def list(cls) -> list[str]:
        """The string values of every member."""
        return [str(member) for member in cls]


class StrEnum(str, enum.Enum, metaclass=EnumWithContains):
    """A str-valued enum that prints as its value and compares equal to it."""

    def __str__(self) -> str:
        return str(self.value)

    @classmethod
    def list(cls) -> list[str]:
        """The values of all members, as strings."""
        return [member.value for member in cls]


class DistributedType(str, enum.Enum, metaclass=EnumWithContains):  # prints like the reference
    """The kind of distributed training in use (NO, MULTI_GPU, DEEPSPEED, FSDP, ...)."""

    NO = "NO"
    MULTI_CPU = "MULTI_CPU"
    MULTI_GPU = "MULTI_GPU"
    MULTI_NPU = "MULTI_NPU"
    MULTI_MLU = "MULTI_MLU"
    MULTI_SDAA = "MULTI_SDAA"
    MULTI_MUSA = "MULTI_MUSA"
    MULTI_XPU = "MULTI_XPU"
    MULTI_HPU = "MULTI_HPU"
    MULTI_NEURON = "MULTI_NEURON"
    DEEPSPEED = "DEEPSPEED"
    FSDP = "FSDP"
    XLA = "XLA"
    MEGATRON_LM = "MEGATRON_LM"


class PrecisionType(StrEnum):
    """The mixed-precision modes: no, fp8, fp16, bf16."""

    NO = "no"
    FP8 = "fp8"
    FP16 = "fp16"
    BF16 = "bf16"


class RNGType(StrEnum):
    """The random number generators that can be synchronised across processes."""

    TORCH = "torch"
    CUDA = "cuda"
    MLU = "mlu"
    SDAA = "sdaa"
    MUSA = "musa"
    NPU = "npu"
    XLA = "xla"
    XPU = "xpu"
    HPU = "hpu"
    NEURON = "neuron"
    GENERATOR = "generator"


class LoggerType(StrEnum):
    """The experiment trackers `log_with` accepts (or `all`)."""

    ALL = "all"
    AIM = "aim"
    TENSORBOARD = "tensorboard"
    WANDB = "wandb"
    COMETML = "comet_ml"
    MLFLOW = "mlflow"
    CLEARML = "clearml"
    DVCLIVE = "dvclive"
    SWANLAB = "swanlab"
    TRACKIO = "trackio"


class DynamoBackend(StrEnum):
    """The `torch.compile` backends a TorchDynamoPlugin may name."""

    NO = "NO"
    EAGER = "EAGER"
    AOT_EAGER = "AOT_EAGER"
    INDUCTOR = "INDUCTOR"
    AOT_TS_NVFUSER = "AOT_TS_NVFUSER"
    NVPRIMS_NVFUSER = "NVPRIMS_NVFUSER"
    CUDAGRAPHS = "CUDAGRAPHS"
    OFI = "OFI"
    FX2TRT = "FX2TRT"
    ONNXRT = "ONNXRT"
    TENSORRT = "TENSORRT"
    AOT_TORCHXLA_TRACE_ONCE = "AOT_TORCHXLA_TRACE_ONCE"
    TORCHXLA_TRACE_ONCE = "TORCHXLA_TRACE_ONCE"
    IPEX = "IPEX"
    TVM = "TVM"
    HPU_BACKEND = "HPU_BACKEND"
    NEURON = "NEURON"


class DDPCommunicationHookType(StrEnum):
    """The DDP gradient communication hooks (compression, PowerSGD)."""

    NO = "no"
    FP16 = "fp16"
    BF16 = "bf16"
    POWER_SGD = "power_sgd"
    BATCHED_POWER_SGD = "batched_power_sgd"


class ComputeEnvironment(str, enum.Enum):
    """Where training runs: this machine or Amazon SageMaker."""

    LOCAL_MACHINE = "LOCAL_MACHINE"
    AMAZON_SAGEMAKER = "AMAZON_SAGEMAKER"


class SageMakerDistributedType(str, enum.Enum, metaclass=EnumWithContains):
    """SageMaker's distribution modes (Cadence does not launch on SageMaker)."""

    NO = "NO"
    DATA_PARALLEL = "DATA_PARALLEL"
    MODEL_PARALLEL = "MODEL_PARALLEL"


class FP8BackendType(str, enum.Enum, metaclass=EnumWithContains):
    """The FP8 implementations a recipe can name."""

    NO = "NO"
    TE = "TE"
    MSAMP = "MSAMP"
    AO = "AO"


class CustomDtype(enum.Enum):
    """Storage dtypes torch has no dtype for (used when sizing quantized models)."""

    FP8 = "fp8"
    INT4 = "int4"
    INT2 = "int2"
