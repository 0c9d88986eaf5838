"""Trackio: runs in a local database (`TRACKIO_DIR`), viewable with `trackio show`."""

from __future__ import annotations

from .base import on_main_process
from .project_run import ProjectRunTracker
from .values import storable_config


class TrackioTracker(ProjectRunTracker):
    """Logs to a Trackio run whose project is `run_name`; `**kwargs` go to `trackio.init`.

    Args:
        run_name (str): The project the run belongs to.
        **kwargs: Passed to `trackio.init` (name, config, dir ...); set them with
            `init_trackers(..., init_kwargs={"trackio": {...}})`.
    """

    name = "trackio"

    @on_main_process
    def store_init_configuration(self, values: dict) -> None:
        """Added to the run's config, which Trackio saves with the first logged values.

        Args:
            values (dict): The run's hyperparameters (nested dicts and lists allowed); tensors become
                numbers, enums their value, paths text, other objects their text with a warning.
        """
        self.run.config.update(storable_config(values, "Trackio"))
