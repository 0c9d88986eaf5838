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
    """Decorator for tracker methods: run on the main process only, unless the tracker sets `main_process_only = False`.

    Args:
        function (Callable): A method of a `GeneralTracker` subclass.

    Returns:
        Callable: The decorated method.
    """

    @functools.wraps(function)
    def run_if_allowed(self: Any, *args: Any, **kwargs: Any) -> Any:
        if getattr(self, "main_process_only", True) and not is_main_process():
            return None
        return function(self, *args, **kwargs)

    return run_if_allowed  # type: ignore[return-value]


class GeneralTracker:
    """The base class of experiment trackers; subclass it to log to a service Cadence does not know.

    A subclass defines `name` (how `log_with`, `init_kwargs` and `get_tracker` refer to it),
    `requires_logging_directory` (whether it is built with the project's logging folder as second
    argument) and a `tracker` property (the library's own object: a writer, a run). It may set
    `main_process_only = False` to run on every process. Its methods receive the keyword arguments
    the user gives under its name in `init_kwargs` / `log_kwargs`. An instance is passed in `log_with`.

    Raises:
        NotImplementedError: The subclass does not define `name`, `requires_logging_directory` or
            `tracker`.

    Example:
        >>> from cadence import Accelerator
        >>> from cadence.tracking import GeneralTracker
        >>> class ListTracker(GeneralTracker):
        ...     name = "list"
        ...     requires_logging_directory = False
        ...     def __init__(self):
        ...         super().__init__()
        ...         self.rows = []
        ...     @property
        ...     def tracker(self):
        ...         return self.rows
        ...     def log(self, values, step=None, **kwargs):
        ...         self.rows.append((step, values))
        >>> tracker = ListTracker()
        >>> accelerator = Accelerator(log_with=tracker)
        >>> accelerator.init_trackers("demo")
        >>> accelerator.log({"loss": 0.5}, step=1)
        >>> tracker.rows
        [(1, {'loss': 0.5})]
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
        """Create the library's run; called by `init_trackers` once the process state exists."""

    def store_init_configuration(self, values: dict) -> None:
        """Record `values` as the run's hyperparameters (`init_trackers(config=...)`).

        Args:
            values (dict): Names to values.
        """

    def log(self, values: dict, step: int | None = None, **kwargs: Any) -> None:
        """Log `values` at `step` (`Accelerator.log`).

        Args:
            values (dict): Names to numbers, text, or what the library accepts.
            step (int | None): The step.
            **kwargs: The user's `log_kwargs` for this tracker.
        """

    def finish(self) -> None:
        """Close the run and write what is pending (`Accelerator.end_training`)."""


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
