"""Which trackers exist, which are installed, and turning `log_with` into a list of trackers."""

from __future__ import annotations

import importlib.util
import os
import warnings
from typing import Any

from ..core.enums import LoggerType
from .aim import AimTracker
from .base import GeneralTracker
from .clearml import ClearMLTracker
from .comet_ml import CometMLTracker
from .dvclive import DVCLiveTracker
from .mlflow import MLflowTracker
from .swanlab import SwanLabTracker
from .tensorboard import TensorBoardTracker
from .trackio import TrackioTracker
from .wandb import WandBTracker

LOGGER_TYPE_TO_CLASS: dict[str, type[GeneralTracker]] = {
    "aim": AimTracker,
    "comet_ml": CometMLTracker,
    "mlflow": MLflowTracker,
    "tensorboard": TensorBoardTracker,
    "wandb": WandBTracker,
    "clearml": ClearMLTracker,
    "dvclive": DVCLiveTracker,
    "swanlab": SwanLabTracker,
    "trackio": TrackioTracker,
}
_BUILT_IN_CLASSES = dict(LOGGER_TYPE_TO_CLASS)

# The order `"all"` lists installed trackers in.
_BUILT_IN_ORDER = (
    LoggerType.TENSORBOARD,
    LoggerType.WANDB,
    LoggerType.COMETML,
    LoggerType.AIM,
    LoggerType.MLFLOW,
    LoggerType.CLEARML,
    LoggerType.DVCLIVE,
    LoggerType.SWANLAB,
    LoggerType.TRACKIO,
)

# tracker -> (modules any of which makes it usable, what to `pip install`)
_PACKAGES: dict[str, tuple[tuple[str, ...], str]] = {
    "tensorboard": (("tensorboard", "tensorboardX"), "tensorboard"),
    "wandb": (("wandb",), "wandb"),
    "comet_ml": (("comet_ml",), "comet_ml"),
    "aim": (("aim",), "aim<4"),
    "mlflow": (("mlflow",), "mlflow"),
    "clearml": (("clearml",), "clearml"),
    "dvclive": (("dvclive",), "dvclive"),
    "swanlab": (("swanlab",), "swanlab"),
    "trackio": (("trackio",), "trackio"),
}


def _module_installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def is_tracker_available(name: str) -> bool:
    """Whether the package behind the built-in tracker `name` is installed (without importing it)."""
    modules, _ = _PACKAGES[name]
    if not any(_module_installed(module) for module in modules):
        return False
    if name == "aim":  # the tracker speaks Aim 3's API
        import importlib.metadata

        try:
            major = int(importlib.metadata.version("aim").split(".")[0])
        except (importlib.metadata.PackageNotFoundError, ValueError):
            return False
        return major < 4
    return True


def is_tensorboard_available() -> bool:
    """Whether a TensorBoard writer package (tensorboard or tensorboardX) is installed."""
    return is_tracker_available("tensorboard")


def is_wandb_available() -> bool:
    """Whether the `wandb` package is installed."""
    return is_tracker_available("wandb")


def is_comet_ml_available() -> bool:
    """Whether the `comet_ml` package is installed."""
    return is_tracker_available("comet_ml")


def is_aim_available() -> bool:
    """Whether the `aim` package is installed (Aim 3)."""
    return is_tracker_available("aim")


def is_mlflow_available() -> bool:
    """Whether the `mlflow` package is installed."""
    return is_tracker_available("mlflow")


def is_clearml_available() -> bool:
    """Whether the `clearml` package is installed."""
    return is_tracker_available("clearml")


def is_dvclive_available() -> bool:
    """Whether the `dvclive` package is installed."""
    return is_tracker_available("dvclive")


def is_swanlab_available() -> bool:
    """Whether the `swanlab` package is installed."""
    return is_tracker_available("swanlab")


def is_trackio_available() -> bool:
    """Whether the `trackio` package is installed."""
    return is_tracker_available("trackio")


def get_available_trackers() -> list[LoggerType]:
    """The built-in trackers whose package is installed, in the order `"all"` uses."""
    return [logger for logger in _BUILT_IN_ORDER if is_tracker_available(logger.value)]


def register_tracker_class(tracker_class: type[GeneralTracker]) -> None:
    """Make a `GeneralTracker` subclass usable by its `name` in `log_with`, like the built-in ones.

    Register it before creating the `Accelerator`. It is built as `tracker_class(project_name, **kw)`,
    or `tracker_class(project_name, logging_dir, **kw)` when `requires_logging_directory` is true,
    with `kw` taken from `init_kwargs[name]`.

    Args:
        tracker_class (type[GeneralTracker]): The tracker class, with `name` and
            `requires_logging_directory` class attributes.

    Raises:
        ValueError: Not a `GeneralTracker` subclass, or one missing those attributes.
    """
    if not (isinstance(tracker_class, type) and issubclass(tracker_class, GeneralTracker)):
        raise ValueError(
            f"register_tracker_class needs a subclass of GeneralTracker, got {tracker_class!r}."
        )
    if not getattr(tracker_class, "name", None):
        raise ValueError(
            f"{tracker_class.__name__} must define a non-empty `name` class attribute."
        )
    if not hasattr(tracker_class, "requires_logging_directory"):
        raise ValueError(
            f"{tracker_class.__name__} must define `requires_logging_directory` (True if it writes "
            "into the project's logging directory, False otherwise)."
        )
    if tracker_class.name in LOGGER_TYPE_TO_CLASS:
        warnings.warn(
            f"A tracker named {tracker_class.name!r} is already registered; {tracker_class.__name__} "
            "replaces it.",
            UserWarning,
            stacklevel=2,
        )
    LOGGER_TYPE_TO_CLASS[tracker_class.name] = tracker_class


def _is_all(entry: Any) -> bool:
    return isinstance(entry, str) and entry == LoggerType.ALL.value


def _entry_name(entry: Any) -> str:
    if isinstance(entry, str):
        return entry.value if isinstance(entry, LoggerType) else entry
    raise ValueError(
        f"Unsupported logging capability: {entry!r}. log_with takes tracker names "
        f"{LoggerType.list()}, LoggerType members, GeneralTracker instances, or a list of them."
    )


def _check_known(name: str) -> None:
    if name not in LOGGER_TYPE_TO_CLASS:
        raise ValueError(
            f"Unsupported logging capability: {name!r}. Choose from {LoggerType.list()} "
            "(or register a custom tracker class with register_tracker_class)."
        )


def _check_installed(name: str) -> None:
    built_in = LOGGER_TYPE_TO_CLASS[name] is _BUILT_IN_CLASSES.get(name)
    if built_in and not is_tracker_available(name):
        raise ImportError(
            f"log_with asks for the {name!r} tracker but its package is not installed: run "
            f"`pip install '{_PACKAGES[name][1]}'`, or leave {name!r} out of log_with."
        )


def _check_directory(name: str, logging_dir: Any) -> None:
    if LOGGER_TYPE_TO_CLASS[name].requires_logging_directory and logging_dir is None:
        raise ValueError(
            f"Logging with `{name}` requires a `logging_dir`: pass project_dir=... (or a "
            "project_config with logging_dir) to the Accelerator."
        )


def _as_logger(name: str) -> LoggerType | str:
    return LoggerType(name) if name in LoggerType.list() else name


def filter_trackers(
    log_with: Any,
    logging_dir: str | os.PathLike | None = None,
) -> list[LoggerType | str | GeneralTracker]:
    """Resolve `log_with` into the trackers to run: `LoggerType`s / registered names, and the
    `GeneralTracker` instances given as they are.

    `"all"` adds every installed built-in tracker (those needing a logging directory only when there
    is one). A tracker asked for by name must be known and installed, and have a logging directory if
    it needs one: otherwise this raises, before anything is started.

    Args:
        log_with (Any): A tracker or a list of them: `LoggerType`s, registered names, "all", or
            `GeneralTracker` instances; None means none.
        logging_dir (str | os.PathLike | None): The project's logging directory, if any.

    Returns:
        list[LoggerType | str | GeneralTracker]: The trackers to start, each once.

    Raises:
        ValueError: An unknown name, or a tracker that needs a logging directory without one.
        ImportError: A tracker whose package is not installed.
    """
    if log_with is None:
        return []
    entries = list(log_with) if isinstance(log_with, (list, tuple)) else [log_with]
    wants_all = any(_is_all(entry) for entry in entries)
    resolved: list[LoggerType | str | GeneralTracker] = []
    for entry in entries:
        if isinstance(entry, GeneralTracker):
            resolved.append(entry)
            continue
        if _is_all(entry):
            continue
        name = _entry_name(entry)
        _check_known(name)
        _check_installed(name)
        _check_directory(name, logging_dir)
        if _as_logger(name) not in resolved:
            resolved.append(_as_logger(name))
    if wants_all:
        for logger in get_available_trackers():
            if logger in resolved:
                continue
            if (
                LOGGER_TYPE_TO_CLASS[logger.value].requires_logging_directory
                and logging_dir is None
            ):
                warnings.warn(
                    f"log_with='all' leaves out {logger.value!r}: it needs a logging directory "
                    "(pass project_dir=... to the Accelerator).",
                    UserWarning,
                    stacklevel=2,
                )
                continue
            resolved.append(logger)
    return resolved
