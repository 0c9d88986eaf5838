"""`GeneralTracker`, the base class of every experiment tracker, and the do-nothing stand-in.

A tracker is built with the run's name (and a logging directory when it needs one), started once the
process state exists, then receives the run's configuration, values to log, and a final `finish()`.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

from ..runtime.state import PartialState

_Method = TypeVar("_Method", bound=Callable[..., Any])


def is_main_process() -> bool:
    """Whether this process is the main one (the process state is created on first use)."""

    return PartialState().is_main_process


def on_main_process(function: _Method) -> _Method:
    """Run a tracker method only on the main process when its tracker has `main_process_only` set.

    The check happens at call time, so defining or building a tracker never creates the process state.
    """

    @functools.wraps(function)
    def run_if_allowed(self: Any, *args: Any, **kwargs: Any) -> Any:
        if getattr(self, "main_process_only", True) and not is_main_process():
            return None
        return function(self, *args, **kwargs)

    return run_if_allowed  # type: ignore[return-value]


class GeneralTracker:
    """Base class for experiment trackers.

    A subclass defines:

    - `name` (`str`): how the tracker is referred to, e.g. in `init_kwargs` and `get_tracker`;
    - `requires_logging_directory` (`bool`): whether it is built with the project's logging directory
      as its second argument;
    - `tracker` (property): the tracking library's own object (a writer, a run, ...);

    and may define `main_process_only` (`bool`, default `True`): `False` makes the `Accelerator` start
    and feed the tracker on every process instead of the main one only.

    Its methods (`start`, `store_init_configuration`, `log`, `finish`) accept the keyword arguments the
    user gives under the tracker's name in `init_kwargs` / `log_kwargs`.
    """

    main_process_only: bool = True

    def __init__(self, _blank: bool = False) -> None:
        if _blank:
            return
        missing = [
            f"`{attribute}`"
            for attribute in ("name", "requires_logging_directory", "tracker")
            if not _defines(self, attribute)
        ]
        if missing:
            raise NotImplementedError(
                f"{type(self).__name__} does not define {', '.join(missing)}: a tracker class must "
                "define `name`, `requires_logging_directory` and a `tracker` property."
            )

    def start(self) -> None:
        """Create the tracking library's run. Called by `init_trackers`, after the process state exists."""

    def store_init_configuration(self, values: dict) -> None:
        """Record `values` as the run's hyperparameters."""

    def log(self, values: dict, step: int | None = None, **kwargs: Any) -> None:
        """Log `values` (name to number, text, ...) at `step`."""

    def finish(self) -> None:
        """Close the run and flush what is pending."""


def _defines(tracker: GeneralTracker, attribute: str) -> bool:
    # `tracker` is usually a property reading state set in `start()`: look it up on the class.
    return attribute in dir(type(tracker)) or attribute in vars(tracker)


class NoOpTracker(GeneralTracker):
    """What a process that runs no tracker gets back: every call is accepted and does nothing.

    Lets user code call `accelerator.get_tracker("wandb").log_images(...)` (or use the unwrapped writer)
    on every process without `if accelerator.is_main_process` guards.
    """

    requires_logging_directory = False

    def __init__(self, name: str = "") -> None:
        super().__init__(_blank=True)
        self.name = name

    @property
    def tracker(self) -> NoOpTracker:
        """This object itself, so calls on the unwrapped tracker do nothing too."""
        return self

    def __getattr__(self, attribute: str) -> Any:
        if attribute.startswith("__"):
            raise AttributeError(attribute)
        return _do_nothing

    def __call__(self, *args: Any, **kwargs: Any) -> None:
        return None

    def __repr__(self) -> str:
        return f"NoOpTracker(name={self.name!r})"


def _do_nothing(*args: Any, **kwargs: Any) -> None:
    return None
