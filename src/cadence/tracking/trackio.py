"""Trackio: runs in a local database (`TRACKIO_DIR`), viewable with `trackio show`."""

from __future__ import annotations

from typing import Any

from .base import GeneralTracker, on_main_process
from .values import plain_values, storable_config


class TrackioTracker(GeneralTracker):
    """Logs to a Trackio run whose project is `run_name`; `**kwargs` go to `trackio.init`."""

    name = "trackio"
    requires_logging_directory = False

    def __init__(self, run_name: str, **kwargs: Any) -> None:
        super().__init__()
        self.run_name = run_name
        self.init_kwargs = kwargs

    @on_main_process
    def start(self) -> None:
        import trackio

        self.run = trackio.init(project=self.run_name, **self.init_kwargs)

    @property
    def tracker(self) -> Any:
        return self.run

    @on_main_process
    def store_init_configuration(self, values: dict) -> None:
        """Added to the run's config, which Trackio saves with the first logged values."""
        self.run.config.update(storable_config(values, "Trackio"))

    @on_main_process
    def log(self, values: dict, step: int | None = None, **kwargs: Any) -> None:
        self.run.log(plain_values(values), step=step, **kwargs)

    @on_main_process
    def finish(self) -> None:
        self.run.finish()
