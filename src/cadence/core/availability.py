"""`is_*_available`: which optional packages and devices this machine has.

Every check is cheap and truthful: a package is "available" when it is installed (its import spec is
found; versions come from its distribution metadata), and no optional package is imported to
answer. Device checks ask torch, which `import cadence` has loaded already.
"""

from __future__ import annotations

import functools
import importlib.metadata
import importlib.util
import sys
from collections.abc import Callable
from typing import Any, TypeVar

from packaging.version import parse

from .environment import parse_flag_from_env, str_to_bool
from .settings import env_text
from .versions import compare_versions, is_torch_version

F = TypeVar("F", bound=Callable[..., Any])

# Whether torch_xla may be used when installed (the reference's USE_TORCH_XLA switch).
USE_TORCH_XLA = str_to_bool(env_text("USE_TORCH_XLA", "true"), to_bool=True)


def _is_package_available(import_name: str, distribution: str | None = None) -> bool:
    """Installed = importable spec found and (when it has one) distribution metadata present."""
    try:
        if importlib.util.find_spec(import_name) is None:
            return False
    except (ImportError, ValueError):
        return False
    try:
        importlib.metadata.version(distribution or import_name)
    except importlib.metadata.PackageNotFoundError:
        # Some packages install under another distribution name; an importable spec is enough then,
        # unless the caller named the distribution explicitly.
        return distribution is None
    return True


def _version(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def _torch() -> Any:
    import torch

    return torch


def _device_module_available(name: str) -> bool:
    module = getattr(_torch(), name, None)
    try:
        return bool(module is not None and module.is_available())
    except Exception:  # a half-installed vendor extension
        return False


def is_torch_distributed_available() -> bool:
    """Whether this torch build has torch.distributed."""
    return bool(_torch().distributed.is_available())


def is_xccl_available() -> bool:
    """Whether torch.distributed has Intel's XCCL backend."""
    c10d = _torch().distributed.distributed_c10d
    checker = getattr(c10d, "is_xccl_available", None)
    return bool(checker()) if checker is not None else False


def is_import_timer_available() -> bool:
    """Whether `import_timer` is installed."""
    return _is_package_available("import_timer")


def is_pynvml_available() -> bool:
    """Whether NVML's Python binding (pynvml or nvidia-ml-py) is installed."""
    return _is_package_available("pynvml") or _is_package_available("pynvml", "nvidia-ml-py")


def is_amdsmi_available() -> bool:
    """Whether AMD's `amdsmi` binding is installed."""
    return _is_package_available("amdsmi")


def is_rocm_available() -> bool:
    """Whether torch is a ROCm build with a usable GPU."""
    torch = _torch()
    return torch.version.hip is not None and torch.cuda.is_available()


def is_pytest_available() -> bool:
    """Whether pytest is installed."""
    return _is_package_available("pytest")


def is_msamp_available() -> bool:
    """Whether Microsoft's MS-AMP is installed."""
    return _is_package_available("msamp", "ms-amp")


def is_schedulefree_available() -> bool:
    """Whether `schedulefree` is installed."""
    return _is_package_available("schedulefree")


def is_transformer_engine_available() -> bool:
    """Whether NVIDIA Transformer Engine is installed."""
    return _is_package_available(
        "transformer_engine", "transformer-engine"
    ) or _is_package_available("transformer_engine", "transformer_engine")


def is_transformer_engine_mxfp8_available() -> bool:
    """Whether Transformer Engine is installed and this GPU supports MXFP8 (compute capability 10+)."""
    if not is_transformer_engine_available() or not is_cuda_available():
        return False
    return _torch().cuda.get_device_capability() >= (10, 0)


def is_lomo_available() -> bool:
    """Whether `lomo_optim` is installed."""
    return _is_package_available("lomo_optim")


def is_cuda_available() -> bool:
    """Whether a CUDA device can be used (checked without initialising CUDA when NVML can tell)."""
    return bool(_torch().cuda.is_available())


def is_torch_xla_available(check_is_tpu: bool = False, check_is_gpu: bool = False) -> bool:
    """Whether torch_xla is installed and enabled (`USE_TORCH_XLA`); with `check_is_tpu` or
    `check_is_gpu`, whether its runtime device is of that kind.

    Args:
        check_is_tpu (bool): Require the XLA device to be a TPU.
        check_is_gpu (bool): Require the XLA device to be a GPU (checked instead of `check_is_tpu`
            when both are set).
    """
    if not USE_TORCH_XLA or not _is_package_available("torch_xla"):
        return False
    if not (check_is_tpu or check_is_gpu):
        return True
    import torch_xla.runtime  # optional dependency

    device_type = torch_xla.runtime.device_type()
    return device_type in ("GPU", "CUDA") if check_is_gpu else device_type == "TPU"


def is_torchao_available() -> bool:
    """Whether torchao 0.6.1 or newer is installed."""
    version = _version("torchao")
    return version is not None and compare_versions(parse(version), ">=", "0.6.1")


def is_deepspeed_available() -> bool:
    """Whether DeepSpeed is installed."""
    return _is_package_available("deepspeed")


def is_pippy_available() -> bool:
    """Whether torch has pipeline parallelism (torch.distributed.pipelining, torch 2.4+)."""
    return is_torch_version(">=", "2.4.0")


def is_bf16_available(ignore_tpu: bool = False) -> bool:
    """Whether bf16 math is supported here: the GPU's support on CUDA/XPU, always on CPU.

    Args:
        ignore_tpu (bool): On a TPU, answer False instead of True (default False).
    """
    torch = _torch()
    if is_torch_xla_available(check_is_tpu=True):
        return not ignore_tpu
    if torch.cuda.is_available():
        return bool(torch.cuda.is_bf16_supported())
    if _device_module_available("xpu"):
        return bool(torch.xpu.is_bf16_supported())
    if is_mps_available():
        return bool(torch.backends.mps.is_macos_or_newer(14, 0))
    return True


def is_fp16_available() -> bool:
    """Whether fp16 mixed precision can be used (everywhere except Habana Gaudi 1)."""
    return not is_habana_gaudi1()


def is_fp8_available() -> bool:
    """Whether an FP8 backend (MS-AMP, Transformer Engine or torchao) is installed."""
    return is_msamp_available() or is_transformer_engine_available() or is_torchao_available()


def is_bnb_available(min_version: str | None = None) -> bool:
    """Whether bitsandbytes is installed (and at least `min_version`, when given).

    Args:
        min_version (str | None): The oldest acceptable version, e.g. "0.43.2"; None accepts any.
    """
    version = _version("bitsandbytes")
    if version is None or not _is_package_available("bitsandbytes"):
        return False
    return min_version is None or compare_versions(parse(version), ">=", min_version)


def is_4bit_bnb_available() -> bool:
    """Whether bitsandbytes 0.39.0+ (4-bit layers) is installed."""
    return is_bnb_available("0.39.0")


def is_8bit_bnb_available() -> bool:
    """Whether bitsandbytes 0.37.2+ (8-bit layers) is installed."""
    return is_bnb_available("0.37.2")


def is_bitsandbytes_multi_backend_available() -> bool:
    """Whether the installed bitsandbytes has its multi-backend feature (needs importing it)."""
    if not is_bnb_available():
        return False
    import bitsandbytes  # optional dependency

    return "multi_backend" in getattr(bitsandbytes, "features", set())


def is_torchvision_available() -> bool:
    """Whether torchvision is installed."""
    return _is_package_available("torchvision")


def is_megatron_lm_available() -> bool:
    """Whether Megatron-LM core is installed and enabled (`ACCELERATE_USE_MEGATRON_LM=true`)."""
    if not parse_flag_from_env("ACCELERATE_USE_MEGATRON_LM"):
        return False
    return _is_package_available("megatron")


def is_transformers_available() -> bool:
    """Whether 🤗 Transformers is installed."""
    return _is_package_available("transformers")


def is_datasets_available() -> bool:
    """Whether 🤗 Datasets is installed."""
    return _is_package_available("datasets")


def is_peft_available() -> bool:
    """Whether PEFT is installed."""
    return _is_package_available("peft")


def is_timm_available() -> bool:
    """Whether timm is installed."""
    return _is_package_available("timm")


def is_triton_available() -> bool:
    """Whether Triton is installed."""
    return _is_package_available("triton") or _is_package_available("triton", "triton-xpu")


def is_aim_available() -> bool:
    """Whether Aim older than 4.0 (the API the tracker uses) is installed."""
    version = _version("aim")
    return version is not None and compare_versions(parse(version), "<", "4.0.0")


def is_tensorboard_available() -> bool:
    """Whether TensorBoard or tensorboardX is installed."""
    return _is_package_available("tensorboard") or _is_package_available("tensorboardX")


def is_wandb_available() -> bool:
    """Whether Weights & Biases is installed."""
    return _is_package_available("wandb")


def is_dvclive_available() -> bool:
    """Whether DVCLive is installed."""
    return _is_package_available("dvclive")


def is_comet_ml_available() -> bool:
    """Whether Comet ML is installed."""
    return _is_package_available("comet_ml")


def is_swanlab_available() -> bool:
    """Whether SwanLab is installed."""
    return _is_package_available("swanlab")


def is_trackio_available() -> bool:
    """Whether Trackio is installed (Python 3.10+)."""
    return sys.version_info >= (3, 10) and _is_package_available("trackio")


def is_boto3_available() -> bool:
    """Whether boto3 is installed."""
    return _is_package_available("boto3")


def is_rich_available() -> bool:
    """Whether rich is installed and its use is switched on (`ACCELERATE_ENABLE_RICH=true`)."""
    return _is_package_available("rich") and parse_flag_from_env("ACCELERATE_ENABLE_RICH", False)


def is_sagemaker_available() -> bool:
    """Whether the SageMaker SDK is installed."""
    return _is_package_available("sagemaker")


def is_tqdm_available() -> bool:
    """Whether tqdm is installed."""
    return _is_package_available("tqdm")


def is_clearml_available() -> bool:
    """Whether ClearML is installed."""
    return _is_package_available("clearml")


def is_pandas_available() -> bool:
    """Whether pandas is installed."""
    return _is_package_available("pandas")


def is_matplotlib_available() -> bool:
    """Whether matplotlib is installed."""
    return _is_package_available("matplotlib")


def is_mlflow_available() -> bool:
    """Whether MLflow (full or `mlflow-skinny`) is installed."""
    if _version("mlflow") is not None or _version("mlflow-skinny") is not None:
        return _is_package_available("mlflow", "mlflow") or _is_package_available(
            "mlflow", "mlflow-skinny"
        )
    return False


def is_numpy_available(min_version: str = "1.25.0") -> bool:
    """Whether numpy `min_version` or newer is installed.

    Args:
        min_version (str): The oldest acceptable numpy version (default "1.25.0").
    """
    version = _version("numpy")
    return version is not None and compare_versions(parse(version), ">=", min_version)


def is_mps_available(min_version: str = "1.12") -> bool:
    """Whether Apple's MPS backend is built and usable (torch `min_version` or newer).

    Args:
        min_version (str): The oldest torch version whose MPS support is accepted (default "1.12").
    """
    torch = _torch()
    mps = getattr(torch.backends, "mps", None)
    return (
        is_torch_version(">=", min_version)
        and mps is not None
        and mps.is_available()
        and mps.is_built()
    )


def _vendor_available(package: str, device_module: str, check_device: bool) -> bool:
    if not _is_package_available(package):
        return False
    if not check_device:
        return _device_module_available(device_module)
    try:
        return (
            _device_module_available(device_module)
            and getattr(_torch(), device_module).device_count() > 0
        )
    except RuntimeError:
        return False


def is_mlu_available(check_device: bool = False) -> bool:
    """Whether Cambricon MLU support (`torch_mlu`) is installed with a device.

    Args:
        check_device (bool): Also require at least one device to be visible (default False: the
            package and torch's device module suffice).
    """
    return _vendor_available("torch_mlu", "mlu", check_device)


def is_musa_available(check_device: bool = False) -> bool:
    """Whether Moore Threads MUSA support (`torch_musa`) is installed with a device.

    Args:
        check_device (bool): Also require at least one device to be visible (default False: the
            package and torch's device module suffice).
    """
    return _vendor_available("torch_musa", "musa", check_device)


def is_npu_available(check_device: bool = False) -> bool:
    """Whether Ascend NPU support (`torch_npu`) is installed with a device.

    Args:
        check_device (bool): Also require at least one device to be visible (default False: the
            package and torch's device module suffice).
    """
    return _vendor_available("torch_npu", "npu", check_device)


def is_sdaa_available(check_device: bool = False) -> bool:
    """Whether Tecorigin SDAA support (`torch_sdaa`) is installed with a device.

    Args:
        check_device (bool): Also require at least one device to be visible (default False: the
            package and torch's device module suffice).
    """
    return _vendor_available("torch_sdaa", "sdaa", check_device)


def is_neuron_available(check_device: bool = False) -> bool:
    """Whether AWS Neuron support (`torch_neuronx`) is installed (with a device, if `check_device`).

    Args:
        check_device (bool): Also require torch's `neuron` device module (default False).
    """
    if not _is_package_available("torch_neuronx"):
        return False
    return not check_device or _device_module_available("neuron")


def is_hpu_available(init_hccl: bool = False) -> bool:
    """Whether Intel Gaudi support (`habana_frameworks`) is installed with a device.

    Args:
        init_hccl (bool): Accepted for Accelerate's signature; Cadence does not initialise HCCL here.
    """
    if not _is_package_available("habana_frameworks"):
        return False
    return _device_module_available("hpu")


def is_habana_gaudi1() -> bool:
    """Whether the Gaudi device here is a first-generation Gaudi (False without Gaudi support)."""
    if not is_hpu_available():
        return False
    import habana_frameworks.torch.utils.experimental as hpu_experimental  # optional dependency

    return hpu_experimental._get_device_type() == hpu_experimental.synDeviceType.synDeviceGaudi


def is_xpu_available(check_device: bool = False) -> bool:
    """Whether an Intel XPU can be used through torch.

    Args:
        check_device (bool): Also require at least one XPU to be visible (default False).
    """
    if not _device_module_available("xpu"):
        return False
    return not check_device or _torch().xpu.device_count() > 0


def is_torchdata_available() -> bool:
    """Whether torchdata is installed."""
    return _is_package_available("torchdata")


def is_torchdata_stateful_dataloader_available() -> bool:
    """Whether torchdata 0.8+ (with `StatefulDataLoader`) is installed."""
    version = _version("torchdata")
    return version is not None and compare_versions(parse(version), ">=", "0.8.0")


def is_weights_only_available() -> bool:
    """Whether `torch.load(weights_only=True)` with safe globals exists (torch 2.4+)."""
    return is_torch_version(">=", "2.4.0")


def deepspeed_required(func: F) -> F:
    """Decorator: the wrapped function raises `ImportError` when DeepSpeed is not installed.

    Example:
        >>> @deepspeed_required
        ... def build_engine(): ...

    Args:
        func (F): The function that needs DeepSpeed.

    Returns:
        F: The wrapped function.
    """

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if not is_deepspeed_available():
            raise ImportError(
                f"`{func.__name__}` requires DeepSpeed. Install it with `pip install deepspeed`."
            )
        return func(*args, **kwargs)

    return wrapper  # type: ignore[return-value]


def torchao_required(func: F) -> F:
    """Decorator: the wrapped function raises `ImportError` when torchao (0.6.1+) is not installed.

    Args:
        func (F): The function that needs torchao.

    Returns:
        F: The wrapped function.
    """

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if not is_torchao_available():
            raise ImportError(
                f"`{func.__name__}` requires torchao 0.6.1 or newer. Install it with `pip install torchao`."
            )
        return func(*args, **kwargs)

    return wrapper  # type: ignore[return-value]
