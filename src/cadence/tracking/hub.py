"""The `Accelerator`'s experiment tracking: `init_trackers`, `log`, `get_tracker`, `end_training`.

Trackers run on the main process unless their class sets `main_process_only = False`. Every process
can make the same calls: where a tracker does not run, they do nothing, and `get_tracker` gives a
stand-in that accepts any call.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable, Mapping
from typing import Any

from .base import GeneralTracker, NoOpTracker, is_main_process

LoggingDir = str | os.PathLike | None


class TrackerHub:
    """The trackers of one `Accelerator`.

    Args:
        log_with: what the user passed as `Accelerator(log_with=...)`; resolved (and checked) here.
        logging_dir: the project's logging directory, or a function returning the current one.
    """

    def __init__(self, log_with: Any, logging_dir: LoggingDir | Callable[[], LoggingDir] = None):
        self._logging_dir = logging_dir
        self.log_with: list[Any] = []
        if log_with is not None:  # the tracker classes load only when trackers are asked for
            from .registry import filter_trackers  # deferred: tracker classes load with log_with

            self.log_with = filter_trackers(log_with, self.logging_dir)
        if log_with is not None and not self.log_with:
            warnings.warn(
                f"log_with={log_with!r} was passed but none of its trackers is installed: "
                "nothing will be logged.",
                UserWarning,
                stacklevel=3,
            )
        self.trackers: list[GeneralTracker] = []

    @property
    def logging_dir(self) -> LoggingDir:
        """The logging directory trackers write under (read from the project config if callable)."""
        return self._logging_dir() if callable(self._logging_dir) else self._logging_dir

    def init_trackers(
        self, project_name: str, config: dict | None = None, init_kwargs: dict | None = None
    ) -> None:
        """Start a run named `project_name` on every tracker, storing `config` as its hyperparameters.

        `init_kwargs` maps a tracker's name to keyword arguments for its constructor, e.g.
        `{"wandb": {"tags": ["baseline"]}}`.
        """
        init_kwargs = {} if init_kwargs is None else init_kwargs
        if not isinstance(init_kwargs, Mapping):
            raise TypeError(
                f"init_kwargs must be a dict of tracker name -> keyword arguments, got "
                f"{type(init_kwargs).__name__}."
            )
        if config is not None and not isinstance(config, Mapping):
            raise TypeError(
                f"config must be a dict of hyperparameters, got {type(config).__name__}."
            )
        main = is_main_process()
        started = []
        for entry in self.log_with:
            tracker = self._build(entry, project_name, init_kwargs, main)
            if tracker is not None and (main or not tracker.main_process_only):
                started.append(tracker)
        for tracker in started:
            tracker.start()
        if config is not None:
            for tracker in started:
                tracker.store_init_configuration(config)
        self.trackers.extend(started)

    def _build(
        self, entry: Any, project_name: str, init_kwargs: Mapping, main: bool
    ) -> GeneralTracker | None:
        if isinstance(entry, GeneralTracker):
            return entry  # the user built it already
        name = str(entry)
        from .registry import LOGGER_TYPE_TO_CLASS  # deferred: tracker classes load with log_with

        tracker_class = LOGGER_TYPE_TO_CLASS[name]
        if not main and tracker_class.main_process_only:
            return None
        kwargs = init_kwargs.get(name, {})
        if tracker_class.requires_logging_directory:
            return tracker_class(project_name, self.logging_dir, **kwargs)
        return tracker_class(project_name, **kwargs)

    def log(self, values: dict, step: int | None = None, log_kwargs: dict | None = None) -> None:
        """Log `values` to every tracker running on this process, at `step` if given.

        `log_kwargs` maps a tracker's name to keyword arguments for its `log`.
        """
        if not isinstance(values, Mapping):
            raise TypeError(
                f"log() takes a dict of name -> value, got {type(values).__name__}: "
                "e.g. accelerator.log({'loss': loss}, step=step)."
            )
        log_kwargs = {} if log_kwargs is None else log_kwargs
        for tracker in self.trackers:
            tracker.log(values, step=step, **log_kwargs.get(tracker.name, {}))

    def get_tracker(self, name: str, unwrap: bool = False) -> Any:
        """The tracker called `name` (its library object if `unwrap`).

        Where that tracker does not run (other processes, or before `init_trackers`), a stand-in
        that accepts every call and does nothing.
        """
        for tracker in self.trackers:
            if tracker.name == name:
                return tracker.tracker if unwrap else tracker
        if not self.trackers or name in self._configured_names():
            return NoOpTracker(name)
        raise ValueError(
            f"{name!r} is not one of the trackers of this Accelerator: "
            f"{sorted(self._configured_names())}."
        )

    def _configured_names(self) -> set[str]:
        return {
            entry.name if isinstance(entry, GeneralTracker) else str(entry)
            for entry in self.log_with
        }

    def end_training(self) -> None:
        """Finish every tracker running on this process, the last started first.

        Several tracking libraries wrap `sys.stdout`/`sys.stderr`; undoing the wrappers in reverse
        order restores each one's predecessor (finishing Comet before SwanLab recursed forever).
        """
        for tracker in reversed(self.trackers):
            tracker.finish()
