"""Experiment tracking: `GeneralTracker`, one tracker class per library, and `log_with` resolution.

Each tracker imports its library only when a run starts, so importing this package is cheap.
"""

from .aim import AimTracker
from .base import GeneralTracker, NoOpTracker, on_main_process
from .clearml import ClearMLTracker
from .comet_ml import CometMLTracker
from .dvclive import DVCLiveTracker
from .hub import TrackerHub
from .mlflow import MLflowTracker
from .registry import (
    LOGGER_TYPE_TO_CLASS,
    filter_trackers,
    get_available_trackers,
    is_tracker_available,
    register_tracker_class,
)
from .swanlab import SwanLabTracker
from .tensorboard import TensorBoardTracker
from .trackio import TrackioTracker
from .wandb import WandBTracker

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
