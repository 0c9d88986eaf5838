"""DVCLive: metrics and params as plain files (`dvclive/` by default) that DVC can track."""

from __future__ import annotations

from typing import Any

from .base import GeneralTracker, on_main_process
from .values import plain_values, storable_config, warn_dropped


class DVCLiveTracker(GeneralTracker):
    """Logs through a `dvclive.Live` (`live`, or one built from `**kwargs`); `run_name` is unused.

    Example: `accelerator.init_trackers("project", init_kwargs={"dvclive": {"dir": "my_directory"}})`.

    Args:
        run_name (str | None): Ignored (DVCLive has no run name); accepted as every tracker takes it.
        live (Any): An existing `dvclive.Live` to log through; None builds one at start.
        **kwargs: Passed to `dvclive.Live` when one is built (dir, save_dvc_exp ...).
    """

    name = "dvclive"
    requires_logging_directory = False

    def __init__(self, run_name: str | None = None, live: Any = None, **kwargs: Any) -> None:
        super().__init__()
        self.live = live
        self.init_kwargs = kwargs

    @on_main_process
    def start(self) -> None:
        """Create the `dvclive.Live` logger unless one was passed in (main process only)."""
        if self.live is None:
            from dvclive import Live

            self.live = Live(**self.init_kwargs)

    @property
    def tracker(self) -> Any:
        """The underlying `dvclive.Live` logger."""
        return self.live

    @on_main_process
    def store_init_configuration(self, values: dict) -> None:
        """Log `values` as DVCLive params.

        Args:
            values (dict): The run's hyperparameters (nested dicts and lists allowed); tensors become
                numbers, enums their value, paths text, other objects their text with a warning.
        """
        self.live.log_params(storable_config(values, "DVCLive"))

    @on_main_process
    def log(self, values: dict, step: int | None = None, **kwargs: Any) -> None:
        """Logs the metrics at `step` (or the next step) then moves to the next step.

        Args:
            values (dict): Names and values to log; one-element tensors and NumPy scalars count as numbers.
            step (int | None): The training step they belong to; None lets the tracker pick.
            **kwargs: Passed to `Live.log_metric` (plot, timestamp ...).
        """
        from dvclive.plots import Metric

        if step is not None:
            self.live.step = step
        for key, value in plain_values(values).items():
            if Metric.could_log(value):
                self.live.log_metric(key, value, **kwargs)
            else:
                warn_dropped("DVCLive", key, value, "numbers")
        self.live.next_step()

    @on_main_process
    def finish(self) -> None:
        """End the DVCLive session."""
        self.live.end()
