"""Comet: online experiments need an API key in Comet's config; `online=False` writes an offline archive."""

from __future__ import annotations

from typing import Any

from .base import GeneralTracker, on_main_process
from .values import plain_values, storable_config, warn_dropped


class CometMLTracker(GeneralTracker):
    """Logs to a Comet experiment in project `run_name`; `**kwargs` go to `comet_ml.start`
    (to `comet_ml.Experiment` before comet_ml 3.41).

    Args:
        run_name (str): The Comet project the experiment belongs to.
        **kwargs: Passed to `comet_ml.start` (or `comet_ml.Experiment`): api_key, workspace ...
    """

    name = "comet_ml"
    requires_logging_directory = False

    def __init__(self, run_name: str, **kwargs: Any) -> None:
        super().__init__()
        self.run_name = run_name
        self.init_kwargs = kwargs

    @on_main_process
    def start(self) -> None:
        """Start the Comet experiment (main process only)."""
        import comet_ml
        from packaging.version import Version

        if Version(comet_ml.__version__) >= Version("3.41.0"):
            self.writer = comet_ml.start(project_name=self.run_name, **self.init_kwargs)
        else:
            self.writer = comet_ml.Experiment(project_name=self.run_name, **self.init_kwargs)

    @property
    def tracker(self) -> Any:
        """The underlying Comet experiment object."""
        return self.writer

    @on_main_process
    def store_init_configuration(self, values: dict) -> None:
        """Log `values` as the experiment's parameters.

        Args:
            values (dict): The run's hyperparameters (nested dicts and lists allowed); tensors become
                numbers, enums their value, paths text, other objects their text with a warning.
        """
        self.writer.log_parameters(storable_config(values, "Comet"))

    @on_main_process
    def log(self, values: dict, step: int | None = None, **kwargs: Any) -> None:
        """Numbers become metrics, strings "others", and dicts of numbers several metrics.

        Args:
            values (dict): Names and values to log; one-element tensors and NumPy scalars count as numbers.
            step (int | None): The training step they belong to; None lets the tracker pick.
            **kwargs: Passed to `log_metric`, `log_other` or `log_metrics`.
        """
        if step is not None:
            self.writer.set_step(step)
        for key, value in plain_values(values).items():
            if isinstance(value, (int, float)):
                self.writer.log_metric(key, value, step=step, **kwargs)
            elif isinstance(value, str):
                self.writer.log_other(key, value, **kwargs)
            elif isinstance(value, dict):
                self.writer.log_metrics(value, step=step, **kwargs)
            else:
                warn_dropped("Comet", key, value, "numbers, strings and dicts of numbers")

    @on_main_process
    def finish(self) -> None:
        """End the Comet experiment."""
        self.writer.end()
