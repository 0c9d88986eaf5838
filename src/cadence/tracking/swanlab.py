"""SwanLab: cloud runs, or local ones with `init_kwargs={"swanlab": {"mode": "offline"}}`."""

from __future__ import annotations

from .base import on_main_process
from .project_run import ProjectRunTracker
from .values import storable_config


class SwanLabTracker(ProjectRunTracker):
    """Logs to a SwanLab run whose project is `run_name`; `**kwargs` go to `swanlab.init`."""

    name = "swanlab"

    @on_main_process
    def store_init_configuration(self, values: dict) -> None:
        """Add `values` to the SwanLab run's config."""
        import swanlab

        swanlab.config.update(storable_config(values, "SwanLab"))
