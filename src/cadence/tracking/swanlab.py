"""SwanLab: cloud runs, or local ones with `init_kwargs={"swanlab": {"mode": "offline"}}`."""

from __future__ import annotations

from typing import Any

from .base import GeneralTracker, on_main_process
from .values import plain_values, storable_config


class SwanLabTracker(GeneralTracker):
    """Logs to a SwanLab run whose project is `run_name`; `**kwargs` go to `swanlab.init`."""

    name = "swanlab"
    requires_logging_directory = False

    def __init__(self, run_name: str, **kwargs: Any) -> None:
        super().__init__()
        self.run_name = run_name
        self.init_kwargs = kwargs

    @on_main_process
    def start(self) -> None:
        import swanlab

        self.run = swanlab.init(project=self.run_name, **self.init_kwargs)

    @property
    def tracker(self) -> Any:
        return self.run

    @on_main_process
    def store_init_configuration(self, values: dict) -> None:
        import swanlab

        swanlab.config.update(storable_config(values, "SwanLab"))

    @on_main_process
    def log(self, values: dict, step: int | None = None, **kwargs: Any) -> None:
        """`**kwargs` go to `swanlab.log` (e.g. `print_to_console`)."""
        self.run.log(plain_values(values), step=step, **kwargs)

    @on_main_process
    def log_images(self, values: dict, step: int | None = None, **kwargs: Any) -> None:
        """Log lists of images (`name -> [array or PIL image, ...]`) as `swanlab.Image`s."""
        import swanlab

        for key, images in values.items():
            self.log({key: [swanlab.Image(image) for image in images]}, step=step, **kwargs)

    @on_main_process
    def finish(self) -> None:
        self.run.finish()
