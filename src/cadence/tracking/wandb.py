"""Weights & Biases: one W&B run per training (offline runs work with `WANDB_MODE=offline`)."""

from __future__ import annotations

from typing import Any

from .base import on_main_process
from .project_run import ProjectRunTracker
from .values import storable_config


class WandBTracker(ProjectRunTracker):
    """Logs to a W&B run whose project is `run_name`; `**kwargs` go to `wandb.init`."""

    name = "wandb"

    @on_main_process
    def store_init_configuration(self, values: dict) -> None:
        """Add `values` to the W&B run's config."""
        self.run.config.update(storable_config(values, "W&B"), allow_val_change=True)

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
        """Log a `wandb.Table` built from `columns` and `data`, or from `dataframe`."""
        import wandb

        table = wandb.Table(columns=columns, data=data, dataframe=dataframe)
        self.log({table_name: table}, step=step, **kwargs)
