"""Skip decorators for the optional packages a test needs (transformers, DeepSpeed, the trackers,
torchao, ...). Re-exported by `cadence.test_utils.testing` (Accelerate's path).
"""

from __future__ import annotations

import unittest
from typing import TypeVar

from ..core.availability import (
    is_aim_available,
    is_bnb_available,
    is_clearml_available,
    is_comet_ml_available,
    is_datasets_available,
    is_deepspeed_available,
    is_dvclive_available,
    is_import_timer_available,
    is_matplotlib_available,
    is_mlflow_available,
    is_pandas_available,
    is_peft_available,
    is_pippy_available,
    is_schedulefree_available,
    is_swanlab_available,
    is_tensorboard_available,
    is_timm_available,
    is_torchao_available,
    is_torchdata_stateful_dataloader_available,
    is_torchvision_available,
    is_trackio_available,
    is_transformer_engine_available,
    is_transformer_engine_mxfp8_available,
    is_transformers_available,
    is_triton_available,
    is_wandb_available,
)

T = TypeVar("T")


_at_least_one_tracker = (
    any(
        [
            is_wandb_available(),
            is_tensorboard_available(),
            is_trackio_available(),
            is_swanlab_available(),
        ]
    )
    and not is_comet_ml_available()
)


def require_peft(test_case: T) -> T:
    """Skip the decorated test unless this machine has PEFT.

    Args:
        test_case (T): The test function or TestCase class.

    Returns:
        T: The test, skipped where the condition does not hold.
    """
    return unittest.skipUnless(is_peft_available(), "test requires PEFT")(test_case)


def require_huggingface_suite(test_case: T) -> T:
    """Skip the decorated test unless this machine has the Hugging Face suite.

    Args:
        test_case (T): The test function or TestCase class.

    Returns:
        T: The test, skipped where the condition does not hold.
    """
    return unittest.skipUnless(
        is_transformers_available() and is_datasets_available(),
        "test requires the Hugging Face suite",
    )(test_case)


def require_datasets(test_case: T) -> T:
    """Skip the decorated test unless this machine has the datasets library.

    Args:
        test_case (T): The test function or TestCase class.

    Returns:
        T: The test, skipped where the condition does not hold.
    """
    return unittest.skipUnless(is_datasets_available(), "test requires the datasets library")(
        test_case
    )


def require_transformers(test_case: T) -> T:
    """Skip the decorated test unless this machine has the transformers library.

    Args:
        test_case (T): The test function or TestCase class.

    Returns:
        T: The test, skipped where the condition does not hold.
    """
    return unittest.skipUnless(
        is_transformers_available(), "test requires the transformers library"
    )(test_case)


def require_timm(test_case: T) -> T:
    """Skip the decorated test unless this machine has the timm library.

    Args:
        test_case (T): The test function or TestCase class.

    Returns:
        T: The test, skipped where the condition does not hold.
    """
    return unittest.skipUnless(is_timm_available(), "test requires the timm library")(test_case)


def require_torchvision(test_case: T) -> T:
    """Skip the decorated test unless this machine has the torchvision library.

    Args:
        test_case (T): The test function or TestCase class.

    Returns:
        T: The test, skipped where the condition does not hold.
    """
    return unittest.skipUnless(is_torchvision_available(), "test requires the torchvision library")(
        test_case
    )


def require_triton(test_case: T) -> T:
    """Skip the decorated test unless this machine has the triton library.

    Args:
        test_case (T): The test function or TestCase class.

    Returns:
        T: The test, skipped where the condition does not hold.
    """
    return unittest.skipUnless(is_triton_available(), "test requires the triton library")(test_case)


def require_schedulefree(test_case: T) -> T:
    """Skip the decorated test unless this machine has the schedulefree library.

    Args:
        test_case (T): The test function or TestCase class.

    Returns:
        T: The test, skipped where the condition does not hold.
    """
    return unittest.skipUnless(
        is_schedulefree_available(), "test requires the schedulefree library"
    )(test_case)


def require_bnb(test_case: T) -> T:
    """Skip the decorated test unless this machine has the bitsandbytes library.

    Args:
        test_case (T): The test function or TestCase class.

    Returns:
        T: The test, skipped where the condition does not hold.
    """
    return unittest.skipUnless(is_bnb_available(), "test requires the bitsandbytes library")(
        test_case
    )


def require_deepspeed(test_case: T) -> T:
    """Skip the decorated test unless this machine has DeepSpeed.

    Args:
        test_case (T): The test function or TestCase class.

    Returns:
        T: The test, skipped where the condition does not hold.
    """
    return unittest.skipUnless(is_deepspeed_available(), "test requires DeepSpeed")(test_case)


def require_tensorboard(test_case: T) -> T:
    """Skip the decorated test unless this machine has Tensorboard.

    Args:
        test_case (T): The test function or TestCase class.

    Returns:
        T: The test, skipped where the condition does not hold.
    """
    return unittest.skipUnless(is_tensorboard_available(), "test requires Tensorboard")(test_case)


def require_wandb(test_case: T) -> T:
    """Skip the decorated test unless this machine has wandb.

    Args:
        test_case (T): The test function or TestCase class.

    Returns:
        T: The test, skipped where the condition does not hold.
    """
    return unittest.skipUnless(is_wandb_available(), "test requires wandb")(test_case)


def require_trackio(test_case: T) -> T:
    """Skip the decorated test unless this machine has trackio.

    Args:
        test_case (T): The test function or TestCase class.

    Returns:
        T: The test, skipped where the condition does not hold.
    """
    return unittest.skipUnless(is_trackio_available(), "test requires trackio")(test_case)


def require_comet_ml(test_case: T) -> T:
    """Skip the decorated test unless this machine has comet_ml.

    Args:
        test_case (T): The test function or TestCase class.

    Returns:
        T: The test, skipped where the condition does not hold.
    """
    return unittest.skipUnless(is_comet_ml_available(), "test requires comet_ml")(test_case)


def require_aim(test_case: T) -> T:
    """Skip the decorated test unless this machine has aim.

    Args:
        test_case (T): The test function or TestCase class.

    Returns:
        T: The test, skipped where the condition does not hold.
    """
    return unittest.skipUnless(is_aim_available(), "test requires aim")(test_case)


def require_clearml(test_case: T) -> T:
    """Skip the decorated test unless this machine has clearml.

    Args:
        test_case (T): The test function or TestCase class.

    Returns:
        T: The test, skipped where the condition does not hold.
    """
    return unittest.skipUnless(is_clearml_available(), "test requires clearml")(test_case)


def require_dvclive(test_case: T) -> T:
    """Skip the decorated test unless this machine has dvclive.

    Args:
        test_case (T): The test function or TestCase class.

    Returns:
        T: The test, skipped where the condition does not hold.
    """
    return unittest.skipUnless(is_dvclive_available(), "test requires dvclive")(test_case)


def require_swanlab(test_case: T) -> T:
    """Skip the decorated test unless this machine has swanlab.

    Args:
        test_case (T): The test function or TestCase class.

    Returns:
        T: The test, skipped where the condition does not hold.
    """
    return unittest.skipUnless(is_swanlab_available(), "test requires swanlab")(test_case)


def require_pandas(test_case: T) -> T:
    """Skip the decorated test unless this machine has pandas.

    Args:
        test_case (T): The test function or TestCase class.

    Returns:
        T: The test, skipped where the condition does not hold.
    """
    return unittest.skipUnless(is_pandas_available(), "test requires pandas")(test_case)


def require_mlflow(test_case: T) -> T:
    """Skip the decorated test unless this machine has mlflow.

    Args:
        test_case (T): The test function or TestCase class.

    Returns:
        T: The test, skipped where the condition does not hold.
    """
    return unittest.skipUnless(is_mlflow_available(), "test requires mlflow")(test_case)


def require_pippy(test_case: T) -> T:
    """Skip the decorated test unless this machine has pippy.

    Args:
        test_case (T): The test function or TestCase class.

    Returns:
        T: The test, skipped where the condition does not hold.
    """
    return unittest.skipUnless(is_pippy_available(), "test requires pippy")(test_case)


def require_import_timer(test_case: T) -> T:
    """Skip the decorated test unless this machine has import_timer.

    Args:
        test_case (T): The test function or TestCase class.

    Returns:
        T: The test, skipped where the condition does not hold.
    """
    return unittest.skipUnless(is_import_timer_available(), "test requires import_timer")(test_case)


def require_transformer_engine(test_case: T) -> T:
    """Skip the decorated test unless this machine has transformers engine.

    Args:
        test_case (T): The test function or TestCase class.

    Returns:
        T: The test, skipped where the condition does not hold.
    """
    return unittest.skipUnless(
        is_transformer_engine_available(), "test requires transformers engine"
    )(test_case)


def require_transformer_engine_mxfp8(test_case: T) -> T:
    """Skip the decorated test unless this machine has transformers engine MXFP8 block scaling.

    Args:
        test_case (T): The test function or TestCase class.

    Returns:
        T: The test, skipped where the condition does not hold.
    """
    return unittest.skipUnless(
        is_transformer_engine_mxfp8_available(),
        "test requires transformers engine MXFP8 block scaling",
    )(test_case)


def require_torchao(test_case: T) -> T:
    """Skip the decorated test unless this machine has torchao.

    Args:
        test_case (T): The test function or TestCase class.

    Returns:
        T: The test, skipped where the condition does not hold.
    """
    return unittest.skipUnless(is_torchao_available(), "test requires torchao")(test_case)


def require_matplotlib(test_case: T) -> T:
    """Skip the decorated test unless this machine has matplotlib.

    Args:
        test_case (T): The test function or TestCase class.

    Returns:
        T: The test, skipped where the condition does not hold.
    """
    return unittest.skipUnless(is_matplotlib_available(), "test requires matplotlib")(test_case)


def require_trackers(test_case: T) -> T:
    """Skip the decorated test unless this machine has at least one tracker to be available and for `comet_ml` to not be installed.

    Args:
        test_case (T): The test function or TestCase class.

    Returns:
        T: The test, skipped where the condition does not hold.
    """
    return unittest.skipUnless(
        _at_least_one_tracker,
        "test requires at least one tracker to be available and for `comet_ml` to not be installed",
    )(test_case)


def require_torchdata_stateful_dataloader(test_case: T) -> T:
    """Skip the decorated test unless this machine has torchdata.stateful_dataloader.

    Args:
        test_case (T): The test function or TestCase class.

    Returns:
        T: The test, skipped where the condition does not hold.
    """
    return unittest.skipUnless(
        is_torchdata_stateful_dataloader_available(), "test requires torchdata.stateful_dataloader"
    )(test_case)
