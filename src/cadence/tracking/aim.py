"""Aim: runs in a local Aim repository (the logging directory), viewable with `aim up`."""

from __future__ import annotations

import os
from typing import Any

from .base import GeneralTracker, on_main_process
from .values import plain_values, storable_config


class AimTracker(GeneralTracker):
    """Logs to an `aim.Run` named `run_name` in the repository at `logging_dir`; `**kwargs` go to
    `aim.Run`.

    Args:
        run_name (str): The name given to the run.
        logging_dir (str | os.PathLike | None): The Aim repository's folder (default "."; None lets Aim
            pick).
        **kwargs: Passed to `aim.Run` (experiment, system_tracking_interval ...).
    """

    name = "aim"
    requires_logging_directory = True

    def __init__(
        self, run_name: str, logging_dir: str | os.PathLike | None = ".", **kwargs: Any
    ) -> None:
        super().__init__()
        self.run_name = run_name
        self.aim_repo_path = logging_dir
        self.init_kwargs = kwargs

    @on_main_process
    def start(self) -> None:
        """Open the `aim.Run` in the logging directory and name it (main process only)."""
        from aim import Run

        repo = os.fspath(self.aim_repo_path) if self.aim_repo_path is not None else None
        self.writer = Run(repo=repo, **self.init_kwargs)
        self.writer.name = self.run_name

    @property
    def tracker(self) -> Any:
        """The underlying `aim.Run`."""
        return self.writer

    @on_main_process
    def store_init_configuration(self, values: dict) -> None:
        """Stored under the run's `hparams` key.

        Args:
            values (dict): The run's hyperparameters (nested dicts and lists allowed); tensors become
                numbers, enums their value, paths text, other objects their text with a warning.
        """
        self.writer["hparams"] = storable_config(values, "Aim")

    @on_main_process
    def log(self, values: dict, step: int | None = None, **kwargs: Any) -> None:
        """Each value is tracked as its own sequence; `**kwargs` go to `Run.track` (e.g. `context`).

        Args:
            values (dict): Names and values to log; one-element tensors and NumPy scalars count as numbers.
            step (int | None): The training step they belong to; None lets the tracker pick.
            **kwargs: Passed to `Run.track` for every value (context, epoch ...).
        """
        for key, value in plain_values(values).items():
            self.writer.track(value, name=key, step=step, **kwargs)

    @on_main_process
    def log_images(
        self, values: dict, step: int | None = None, kwargs: dict[str, dict] | None = None
    ) -> None:
        """Log images (`name -> image` or `name -> (image, caption)`) as `aim.Image`s.

        `kwargs` may hold `{"aim_image": {...}, "track": {...}}`, passed to `aim.Image` and `Run.track`.

        Args:
            values (dict): Names and images (anything `aim.Image` takes), or `(image, caption)` pairs.
            step (int | None): The training step they belong to.
            kwargs (dict[str, dict] | None): Options under "aim_image" (for `aim.Image`) and "track" (for
                `Run.track`); note it is a plain dict argument, not `**kwargs`.
        """
        import aim

        kwargs = kwargs or {}
        image_kwargs = kwargs.get("aim_image", {})
        track_kwargs = kwargs.get("track", {})
        for key, value in values.items():
            image, caption = value if isinstance(value, tuple) else (value, "")
            self.writer.track(
                aim.Image(image, caption=caption, **image_kwargs),
                name=key,
                step=step,
                **track_kwargs,
            )

    @on_main_process
    def finish(self) -> None:
        """Close the Aim run."""
        self.writer.close()
