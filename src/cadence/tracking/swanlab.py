"""SwanLab: cloud runs, or local ones with `init_kwargs={"swanlab": {"mode": "offline"}}`."""

from __future__ import annotations

from .base import on_main_process
from .project_run import ProjectRunTracker
from .values import storable_config


class SwanLabTracker(ProjectRunTracker):
    """Logs to a SwanLab run whose project is `run_name`; `**kwargs` go to `swanlab.init`.

    Args:
        run_name (str): The project the run belongs to.
        **kwargs: Passed to `swanlab.init` (name, config, dir ...); set them with
            `init_trackers(..., init_kwargs={"swanlab": {...}})`.
    """

    name = "swanlab"

    @on_main_process
    def store_init_configuration(self, values: dict) -> None:
        """Add `values` to the SwanLab run's config.

        Args:
            values (dict): The run's hyperparameters (nested dicts and lists allowed); tensors become
                numbers, enums their value, paths text, other objects their text with a warning.
        """
        import swanlab

        swanlab.config.update(storable_config(values, "SwanLab"))
