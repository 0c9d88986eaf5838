"""Weights & Biases: one W&B run per training (offline runs work with `WANDB_MODE=offline`)."""

from __future__ import annotations

from typing import Any

from .base import on_main_process
from .project_run import ProjectRunTracker
from .values import storable_config


class WandBTracker(ProjectRunTracker):
    """Logs to a W&B run whose project is `run_name`; `**kwargs` go to `wandb.init`.

    Args:
        run_name (str): The project the run belongs to.
        **kwargs: Passed to `wandb.init` (name, config, dir ...); set them with
            `init_trackers(..., init_kwargs={"wandb": {...}})`.
    """

    name = "wandb"

    @on_main_process
    def store_init_configuration(self, values: dict) -> None:
        """Add `values` to the W&B run's config.

        Args:
            values (dict): The run's hyperparameters (nested dicts and lists allowed); tensors become
                numbers, enums their value, paths text, other objects their text with a warning.
        """
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
        """Log a `wandb.Table` built from `columns` and `data`, or from `dataframe`.

        Args:
            table_name (str): The name the table is logged under.
            columns (list[str] | None): Column names, for `data`.
            data (list[list[Any]] | None): The rows.
            dataframe (Any): A pandas DataFrame to log instead of `columns` and `data`.
            step (int | None): The training step it belongs to.
            **kwargs: Passed to the run's `log`.
        """
        import wandb

        table = wandb.Table(columns=columns, data=data, dataframe=dataframe)
        self.log({table_name: table}, step=step, **kwargs)
