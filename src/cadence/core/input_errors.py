"""Bad-input errors that say which rank raised them when the job runs on several processes.

Argument checks raise on every rank at once; without the rank in the message the launcher's summary
(and each rank's log) would show the same text N times with nothing to tell them apart.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

from .settings import env_text

# Exception types that describe a bad argument: the ones whose message gets the rank.
INPUT_ERRORS = (TypeError, ValueError, NotImplementedError, ImportError)

_F = TypeVar("_F", bound=Callable[..., Any])


def current_rank() -> int | None:
    """This process's rank when the job has several processes, else None.

    Read from the process state when it exists, otherwise from the launcher's environment (argument
    checks run before the process group is created)."""
    state_module = sys.modules.get("cadence.runtime.state")
    shared = getattr(getattr(state_module, "PartialState", None), "_shared_state", None) or {}
    if "num_processes" in shared:
        return shared.get("process_index") if shared["num_processes"] > 1 else None
    try:
        world_size = int(env_text("WORLD_SIZE", "1"))
        rank = int(env_text("RANK", "0"))
    except ValueError:
        return None
    return rank if world_size > 1 else None


def with_rank(message: str) -> str:
    """`message` prefixed with "[rank N] " on a multi-process job (unchanged otherwise)."""
    rank = current_rank()
    if rank is None or message.startswith("[rank "):
        return message
    return f"[rank {rank}] {message}"


def name_rank(error: BaseException) -> BaseException:
    """Put the rank in front of the message of a bad-input error (in place); returns it."""
    if isinstance(error, INPUT_ERRORS) and len(error.args) == 1 and isinstance(error.args[0], str):
        error.args = (with_rank(error.args[0]),)
        if isinstance(error, ImportError):
            error.msg = error.args[0]  # ImportError prints `msg`, not `args`
    return error


@contextmanager
def rank_named() -> Iterator[None]:
    """Bad-input errors raised inside the block name the rank (same exception, same traceback)."""
    try:
        yield
    except INPUT_ERRORS as error:
        name_rank(error)
        raise


def rank_named_errors(function: _F) -> _F:
    """Decorator form of `rank_named`."""

    @functools.wraps(function)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        with rank_named():
            return function(*args, **kwargs)

    return wrapper  # type: ignore[return-value]


def rank_prefix() -> str:
    """ "[rank N] " inside a multi-process job (so an error names the process it happened on), else ""."""
    rank = current_rank()
    return "" if rank is None else f"[rank {rank}] "


def forgotten_state_error(class_name: str, name: str) -> AttributeError:
    """The error for reading `name` from a process state that was reset and not created again."""
    return AttributeError(
        f"`{class_name}` object has no attribute `{name}`. This happens if "
        f"`{class_name}._reset_state()` was called and an `Accelerator` or `PartialState` was not "
        "reinitialized: create `Accelerator()` (or `PartialState()`) again after a reset."
    )
