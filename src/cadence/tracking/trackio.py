"""Trackio: runs in a local database (`TRACKIO_DIR`), viewable with `trackio show`."""

from __future__ import annotations

from .base import on_main_process
from .project_run import ProjectRunTracker
from .values import storable_config


class TrackioTracker(ProjectRunTracker):
    """Logs to a Trackio run whose project is `run_name`; `**kwargs` go to `trackio.init`."""

    name = "trackio"

    @on_main_process
    def store_init_configuration(self, values: dict) -> None:
        """Added to the run's config, which Trackio saves with the first logged values."""
        self.run.config.update(storable_config(values, "Trackio"))
