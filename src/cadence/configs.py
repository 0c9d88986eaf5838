"""Configuration dataclasses of the Accelerator: dataloaders, project layout, accumulation, dynamo."""

from __future__ import annotations

import numbers
import os
from dataclasses import dataclass
from typing import Any

from .enums import DynamoBackend
from .kwargs import KwargsHandler


@dataclass
class DataLoaderConfiguration:
    """How prepared dataloaders shard, place and resume their batches (the reference's fields, plus
    one Cadence switch at the end).

    `resume_exact_order` (Cadence only, default True): a dataloader resumed mid-epoch from a saved
    state continues the saved epoch with the same samples in the same order. False resumes as the
    reference does, to reproduce its numbers: the order is drawn again from the random state of the
    moment and a stateful dataloader skips the batches already handed out (a plain one starts the
    epoch over). See docs/differences.md.

    Example: `Accelerator(dataloader_config=DataLoaderConfiguration(resume_exact_order=False))`.
    """

    split_batches: bool = False
    dispatch_batches: bool | None = None
    even_batches: bool = True
    use_seedable_sampler: bool = False
    data_seed: int | None = None
    non_blocking: bool = False
    use_stateful_dataloader: bool = False
    resume_exact_order: bool = True

    def __post_init__(self) -> None:
        for name in (
            "split_batches",
            "dispatch_batches",
            "even_batches",
            "use_seedable_sampler",
            "non_blocking",
            "use_stateful_dataloader",
            "resume_exact_order",
        ):
            if isinstance(getattr(self, name), (str, bytes)):
                raise TypeError(
                    f"DataLoaderConfiguration({name}={getattr(self, name)!r}) takes True or False, not "
                    "a string (any non-empty string would count as True)."
                )
        seed = self.data_seed
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, numbers.Integral)):
            raise TypeError(
                f"DataLoaderConfiguration(data_seed=...) must be an integer or None, got {seed!r}."
            )


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
        for name in ("project_dir", "logging_dir"):
            path = getattr(self, name)
            if path is not None and not isinstance(path, (str, os.PathLike)):
                raise TypeError(
                    f"ProjectConfiguration({name}=...) must be a path (str or os.PathLike), got "
                    f"{type(path).__name__}."
                )
        if self.project_dir is not None:
            self.project_dir = os.fspath(self.project_dir)
        self.set_directories(self.project_dir)
        if self.total_limit is not None and (
            not isinstance(self.total_limit, int) or self.total_limit < 0
        ):
            raise ValueError(
                f"total_limit must be a non-negative integer, got {self.total_limit!r}."
            )


@dataclass
class GradientAccumulationPlugin(KwargsHandler):
    """Gradient accumulation settings (the reference's fields, plus one Cadence switch at the end).

    `adjust_last_window` (Cadence only, default True): when a dataloader ends inside an accumulation
    window, the shorter last window's update is the mean gradient of the micro-batches it holds
    (each micro-step's loss is divided by the window's real length). False divides every micro-step
    by `num_steps`, as the reference does, so the last update is smaller. See docs/differences.md.

    Example: `GradientAccumulationPlugin(num_steps=4, adjust_last_window=False)`.
    """

    num_steps: int | None = None
    adjust_scheduler: bool = True
    sync_with_dataloader: bool = True
    sync_each_batch: bool = False
    adjust_last_window: bool = True

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
        name = str(getattr(self.backend, "value", self.backend)).upper()
        if name not in DynamoBackend.list():
            raise ValueError(
                f"Unknown dynamo backend {self.backend!r}: use one of {', '.join(DynamoBackend.list())}."
            )
        self.backend = DynamoBackend(name)
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
