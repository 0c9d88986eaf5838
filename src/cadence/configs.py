"""Configuration dataclasses of the Accelerator: dataloaders, project layout, accumulation, dynamo."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from .enums import DynamoBackend
from .kwargs import KwargsHandler


@dataclass
class DataLoaderConfiguration:
    split_batches: bool = False
    dispatch_batches: bool | None = None
    even_batches: bool = True
    use_seedable_sampler: bool = False
    data_seed: int | None = None
    non_blocking: bool = False
    use_stateful_dataloader: bool = False


@dataclass
class ProjectConfiguration:
    project_dir: str | None = None
    logging_dir: str | None = None
    automatic_checkpoint_naming: bool = False
    total_limit: int | None = None
    iteration: int = 0
    save_on_each_node: bool = False

    def set_directories(self, project_dir: str | os.PathLike | None = None) -> None:
        """Set `project_dir`, and `logging_dir` to it when no logging dir was given."""
        self.project_dir = os.fspath(project_dir) if project_dir is not None else None
        if self.logging_dir is None:
            self.logging_dir = self.project_dir

    def __post_init__(self) -> None:
        if self.project_dir is not None:
            self.project_dir = os.fspath(self.project_dir)
        self.set_directories(self.project_dir)
        if self.total_limit is not None and (
            not isinstance(self.total_limit, int) or self.total_limit < 1
        ):
            raise ValueError(f"total_limit must be a positive integer, got {self.total_limit!r}.")


@dataclass
class GradientAccumulationPlugin(KwargsHandler):
    num_steps: int | None = None
    adjust_scheduler: bool = True
    sync_with_dataloader: bool = True
    sync_each_batch: bool = False

    def __post_init__(self) -> None:
        if self.num_steps is not None and (
            not isinstance(self.num_steps, int) or self.num_steps < 1
        ):
            raise ValueError(
                f"GradientAccumulationPlugin.num_steps must be a positive integer, got {self.num_steps!r}."
            )


@dataclass
class TorchDynamoPlugin(KwargsHandler):
    backend: DynamoBackend | str | None = None
    mode: str | None = None
    fullgraph: bool | None = None
    dynamic: bool | None = None
    options: Any = None
    disable: bool = False
    use_regional_compilation: bool | None = None

    def __post_init__(self) -> None:
        if self.backend is None:
            self.backend = os.environ.get("ACCELERATE_DYNAMO_BACKEND", "no")
        self.backend = DynamoBackend(str(self.backend).upper())
        self.mode = self.mode or os.environ.get("ACCELERATE_DYNAMO_MODE", "default")

    def to_compile_kwargs(self) -> dict[str, Any]:
        kwargs: dict[str, Any] = {"backend": self.backend.value.lower(), "mode": self.mode}
        for name in ("fullgraph", "dynamic", "options", "disable"):
            value = getattr(self, name)
            if value is not None:
                kwargs[name] = value
        if kwargs.get("options") is not None:
            kwargs.pop("mode")  # torch.compile refuses both
        return kwargs
