"""Weights & Biases: one W&B run per training (offline runs work with `WANDB_MODE=offline`)."""

from __future__ import annotations

from typing import Any

from .base import GeneralTracker, on_main_process
from .values import plain_values, storable_config


class WandBTracker(GeneralTracker):
    """Logs to a W&B run whose project is `run_name`; `**kwargs` go to `wandb.init`."""

    name = "wandb"
    requires_logging_directory = False

    def __init__(self, run_name: str, **kwargs: Any) -> None:
        super().__init__()
        self.run_name = run_name
        self.init_kwargs = kwargs

    @on_main_process
    def start(self) -> None:
        import wandb

        self.run = wandb.init(project=self.run_name, **self.init_kwargs)

    @property
    def tracker(self) -> Any:
        return self.run

    @on_main_process
    def store_init_configuration(self, values: dict) -> None:
        self.run.config.update(storable_config(values, "W&B"), allow_val_change=True)

    @on_main_process
    def log(self, values: dict, step: int | None = None, **kwargs: Any) -> None:
        """`**kwargs` go to `wandb.Run.log`."""
        self.run.log(plain_values(values), step=step, **kwargs)

    @on_main_process
    def log_images(self, values: dict, step: int | None = None, **kwargs: Any) -> None:
        """Log lists of images (`name -> [array or PIL image, ...]`) as `wandb.Image`s."""
        import wandb

        for key, images in values.items():
            self.log({key: [wandb.Image(image) for image in images]}, step=step, **kwargs)

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

    @on_main_process
    def finish(self) -> None:
        self.run.finish()
