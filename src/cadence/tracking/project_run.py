"""Trackers whose package starts a run with `<package>.init(project=run_name, **kwargs)` and logs through
`run.log(values, step=...)`: W&B, SwanLab and Trackio."""

from __future__ import annotations

import importlib
from typing import Any

from .base import GeneralTracker, on_main_process
from .values import plain_values


class ProjectRunTracker(GeneralTracker):
    """Subclasses set `name` (also the package to import) and how the config is stored."""

    requires_logging_directory = False

    def __init__(self, run_name: str, **kwargs: Any) -> None:
        super().__init__()
        self.run_name = run_name
        self.init_kwargs = kwargs

    @property
    def package(self) -> Any:
        """The tracking library's module (imported by the tracker's `name`)."""
        return importlib.import_module(self.name)

    @on_main_process
    def start(self) -> None:
        """Start a run in project `run_name` with `package.init` (main process only)."""
        self.run = self.package.init(project=self.run_name, **self.init_kwargs)

    @property
    def tracker(self) -> Any:
        """The run object returned by `package.init`."""
        return self.run

    @on_main_process
    def log(self, values: dict, step: int | None = None, **kwargs: Any) -> None:
        """`**kwargs` go to the run's own `log`.

        Args:
            values (dict): Names and values to log; one-element tensors and NumPy scalars count as numbers.
            step (int | None): The training step they belong to; None lets the tracker pick.
            **kwargs: Passed to the run's `log` (commit ... for W&B).
        """
        self.run.log(plain_values(values), step=step, **kwargs)

    @on_main_process
    def log_images(self, values: dict, step: int | None = None, **kwargs: Any) -> None:
        """Log lists of images (`name -> [array or PIL image, ...]`) as the package's `Image`s.

        Args:
            values (dict): Names and lists of images (numpy arrays or PIL images).
            step (int | None): The training step they belong to.
            **kwargs: Passed to the run's `log`.
        """
        image = self.package.Image
        for key, images in values.items():
            self.log({key: [image(item) for item in images]}, step=step, **kwargs)

    @on_main_process
    def finish(self) -> None:
        """Finish the run."""
        self.run.finish()
