"""ClearML: a ClearML task (offline sessions work with `CLEARML_OFFLINE_MODE=1`)."""

from __future__ import annotations

from typing import Any

from ..core.settings import env_text
from .base import GeneralTracker, on_main_process
from .values import plain_values, storable_config, warn_dropped

_SERIES_PREFIXES = ("eval", "test", "train")


class ClearMLTracker(GeneralTracker):
    """Logs to a ClearML task, the one already running if there is one.

    Args:
        run_name: project and task name unless `CLEARML_PROJECT` / `CLEARML_TASK` are set.
        **kwargs: passed to `clearml.Task.init`.
    """

    name = "clearml"
    requires_logging_directory = False

    def __init__(self, run_name: str | None = None, **kwargs: Any) -> None:
        super().__init__()
        self.user_provided_run_name = run_name
        self._initialized_externally = False
        self.init_kwargs = kwargs

    @on_main_process
    def start(self) -> None:
        """Reuse the current ClearML task, or create one with `Task.init` (main process only)."""
        from clearml import Task

        current = Task.current_task()
        if current:
            self._initialized_externally = True
            self.task = current
            return
        arguments = dict(self.init_kwargs)
        arguments.setdefault(
            "project_name", env_text("CLEARML_PROJECT", self.user_provided_run_name)
        )
        arguments.setdefault("task_name", env_text("CLEARML_TASK", self.user_provided_run_name))
        self.task = Task.init(**arguments)

    @property
    def tracker(self) -> Any:
        """The underlying ClearML task."""
        return self.task

    @on_main_process
    def store_init_configuration(self, values: dict) -> Any:
        """Connect `values` as the task's configuration; returns ClearML's result.

        Args:
            values (dict): The run's hyperparameters (nested dicts and lists allowed); tensors become
                numbers, enums their value, paths text, other objects their text with a warning.

        Returns:
            What `Task.connect_configuration` returns.
        """
        return self.task.connect_configuration(storable_config(values, "ClearML"))

    @on_main_process
    def log(self, values: dict, step: int | None = None, **kwargs: Any) -> None:
        """Numbers only. With a `step` they are scalars (an `eval_`/`test_`/`train_` key prefix picks
        the series, `train` otherwise); without one, single values.

        Args:
            values (dict): Names and values to log; one-element tensors and NumPy scalars count as numbers.
            step (int | None): The training step they belong to; None lets the tracker pick.
            **kwargs: Passed to `Logger.report_scalar` or `Logger.report_single_value`.
        """
        clearml_logger = self.task.get_logger()
        for key, value in plain_values(values).items():
            if not isinstance(value, (int, float)):
                warn_dropped("ClearML", key, value, "numbers")
                continue
            if step is None:
                clearml_logger.report_single_value(name=key, value=value, **kwargs)
                continue
            title, series = self._get_title_series(key)
            clearml_logger.report_scalar(
                title=title, series=series, value=value, iteration=step, **kwargs
            )

    @on_main_process
    def log_images(self, values: dict, step: int | None = None, **kwargs: Any) -> None:
        """Log images (`name -> array or PIL image`) with `Logger.report_image`.

        Args:
            values (dict): Names and images (numpy arrays or PIL images).
            step (int | None): The iteration they belong to.
            **kwargs: Passed to `Logger.report_image`.
        """
        clearml_logger = self.task.get_logger()
        for key, image in values.items():
            title, series = self._get_title_series(key)
            clearml_logger.report_image(
                title=title, series=series, iteration=step, image=image, **kwargs
            )

    @on_main_process
    def log_table(
        self,
        table_name: str,
        columns: list[str] | None = None,
        data: list[list[Any]] | None = None,
        dataframe: Any = None,
        step: int | None = None,
        **kwargs: Any,
    ) -> None:
        """Report a table given as `dataframe`, or as `data` rows (headed by `columns` if given).

        Args:
            table_name (str): The table's title (an `eval_`/`test_`/`train_` prefix picks the series).
            columns (list[str] | None): Column names, a header row put before `data`.
            data (list[list[Any]] | None): The rows, when no `dataframe` is given.
            dataframe (Any): A pandas DataFrame to report instead of `data`.
            step (int | None): The iteration it belongs to.
            **kwargs: Passed to `Logger.report_table`.

        Raises:
            ValueError: Neither `data` nor `dataframe`.
        """
        table = dataframe
        if dataframe is None:
            if data is None:
                raise ValueError("ClearMLTracker.log_table needs `data` (rows) or a `dataframe`.")
            table = [columns, *data] if columns else data
        title, series = self._get_title_series(table_name)
        self.task.get_logger().report_table(
            title=title, series=series, table_plot=table, iteration=step, **kwargs
        )

    @on_main_process
    def finish(self) -> None:
        """Close the task, unless it was started outside (then it is left to its owner)."""
        if self.task and not self._initialized_externally:
            self.task.close()

    @staticmethod
    def _get_title_series(name: str) -> tuple[str, str]:
        for prefix in _SERIES_PREFIXES:
            if name.startswith(prefix + "_"):
                return name[len(prefix) + 1 :], prefix
        return name, "train"
