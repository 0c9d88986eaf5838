"""TensorBoard: scalars, texts and images as event files under `<logging_dir>/<run name>`."""

from __future__ import annotations

import logging
import os
import time
from typing import Any

from .base import GeneralTracker, on_main_process
from .values import flat_config, plain_values, storable_config, warn_dropped

logger = logging.getLogger(__name__)


def _summary_writer_class() -> Any:
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ModuleNotFoundError:
        from tensorboardX import SummaryWriter
    return SummaryWriter


class TensorBoardTracker(GeneralTracker):
    """Logs to TensorBoard event files in `logging_dir/run_name`.

    Args:
        run_name: the run's name (the `project_name` given to `init_trackers`).
        logging_dir: the directory holding the runs.
        **kwargs: passed to `SummaryWriter`.
    """

    name = "tensorboard"
    requires_logging_directory = True

    def __init__(self, run_name: str, logging_dir: str | os.PathLike, **kwargs: Any) -> None:
        super().__init__()
        self.run_name = run_name
        self.logging_dir_param = logging_dir
        self.init_kwargs = kwargs

    @on_main_process
    def start(self) -> None:
        """Open a SummaryWriter in `logging_dir/run_name` (main process only)."""
        self.logging_dir = os.path.join(self.logging_dir_param, self.run_name)
        self.writer = _summary_writer_class()(self.logging_dir, **self.init_kwargs)
        logger.debug("TensorBoard run %s logs to %s", self.run_name, self.logging_dir)

    @property
    def tracker(self) -> Any:
        """The underlying SummaryWriter."""
        return self.writer

    @on_main_process
    def store_init_configuration(self, values: dict) -> None:
        """Store `values` as the run's hparams, and as `hparams.yml` in a new folder of the run.

        Args:
            values (dict): The run's hyperparameters (nested dicts and lists allowed); tensors become
                numbers, enums their value, paths text, other objects their text with a warning.
        """
        import yaml

        storable = storable_config(values, "TensorBoard")
        self.writer.add_hparams(flat_config(storable, "TensorBoard"), metric_dict={})
        self.writer.flush()
        folder = os.path.join(self.logging_dir, str(time.time()))
        os.makedirs(folder, exist_ok=True)
        with open(os.path.join(folder, "hparams.yml"), "w") as handle:
            yaml.safe_dump(storable, handle)

    @on_main_process
    def log(self, values: dict, step: int | None = None, **kwargs: Any) -> None:
        """Numbers become scalars, strings texts, and dicts of numbers grouped scalars.

        Args:
            values (dict): Names and values to log; one-element tensors and NumPy scalars count as numbers.
            step (int | None): The training step they belong to; None lets the tracker pick.
            **kwargs: Passed to `add_scalar`, `add_text` or `add_scalars` (walltime ...).
        """
        for key, value in plain_values(values).items():
            if isinstance(value, (int, float)):
                self.writer.add_scalar(key, value, global_step=step, **kwargs)
            elif isinstance(value, str):
                self.writer.add_text(key, value, global_step=step, **kwargs)
            elif isinstance(value, dict):
                self.writer.add_scalars(key, value, global_step=step, **kwargs)
            else:
                warn_dropped("TensorBoard", key, value, "numbers, strings and dicts of numbers")
        self.writer.flush()

    @on_main_process
    def log_images(self, values: dict, step: int | None = None, **kwargs: Any) -> None:
        """Log batches of images (`name -> array or tensor of shape (N, C, H, W)`) with `add_images`.

        Args:
            values (dict): Names and image batches of shape (N, C, H, W).
            step (int | None): The training step they belong to.
            **kwargs: Passed to `SummaryWriter.add_images` (dataformats ...).
        """
        for key, images in values.items():
            self.writer.add_images(key, images, global_step=step, **kwargs)
        self.writer.flush()

    @on_main_process
    def finish(self) -> None:
        """Close the SummaryWriter."""
        self.writer.close()
