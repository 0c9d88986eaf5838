"""Amazon SageMaker names: present so scripts import; every use raises."""

from __future__ import annotations

from typing import Any

from . import unsupported

FEATURE = "Amazon SageMaker launching"
INSTEAD = "Launch on the machines themselves with `cadence launch` (multi-machine flags supported)."


def prepare_sagemager_args_inputs(sagemaker_config: Any, args: Any) -> Any:
    """Arguments of a SageMaker estimator (unsupported; the misspelling is Accelerate's name).

    Args:
        sagemaker_config (Any): The SageMaker config file's settings.
        args (Any): The parsed `launch` arguments.

    Raises:
        UnsupportedFeatureError: Always (a `NotImplementedError`): launching on SageMaker is not supported.
    """
    return unsupported("prepare_sagemager_args_inputs", FEATURE, INSTEAD)


def sagemaker_launcher(sagemaker_config: Any, args: Any) -> None:
    """Start a SageMaker training job (unsupported)."""
    unsupported("sagemaker_launcher", FEATURE, INSTEAD)


def get_sagemaker_input() -> Any:
    """Questions for a SageMaker config file (unsupported)."""
    return unsupported("get_sagemaker_input", FEATURE, INSTEAD)
