"""Experiment tracking: `GeneralTracker`, one tracker class per library, and `log_with` resolution.

Each tracker imports its library only when a run starts, and each tracker module is imported on first
use of its name, so importing this package (which every `Accelerator` does) is cheap.
"""

from __future__ import annotations

from ..core.lazy_exports import lazy_exports

_EXPORTS = {
    "AimTracker": "cadence.tracking.aim",
    "ClearMLTracker": "cadence.tracking.clearml",
    "CometMLTracker": "cadence.tracking.comet_ml",
    "DVCLiveTracker": "cadence.tracking.dvclive",
    "GeneralTracker": "cadence.tracking.base",
    "NoOpTracker": "cadence.tracking.base",
    "on_main_process": "cadence.tracking.base",
    "TrackerHub": "cadence.tracking.hub",
    "MLflowTracker": "cadence.tracking.mlflow",
    "LOGGER_TYPE_TO_CLASS": "cadence.tracking.registry",
    "filter_trackers": "cadence.tracking.registry",
    "get_available_trackers": "cadence.tracking.registry",
    "is_tracker_available": "cadence.tracking.registry",
    "register_tracker_class": "cadence.tracking.registry",
    "SwanLabTracker": "cadence.tracking.swanlab",
    "TensorBoardTracker": "cadence.tracking.tensorboard",
    "TrackioTracker": "cadence.tracking.trackio",
    "WandBTracker": "cadence.tracking.wandb",
}

__all__ = [
    "LOGGER_TYPE_TO_CLASS",
    "AimTracker",
    "ClearMLTracker",
    "CometMLTracker",
    "DVCLiveTracker",
    "GeneralTracker",
    "MLflowTracker",
    "NoOpTracker",
    "SwanLabTracker",
    "TensorBoardTracker",
    "TrackerHub",
    "TrackioTracker",
    "WandBTracker",
    "filter_trackers",
    "get_available_trackers",
    "is_tracker_available",
    "on_main_process",
    "register_tracker_class",
]

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
