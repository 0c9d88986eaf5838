"""`get_logger`: a logger whose records are emitted on the main process only unless asked otherwise."""

from __future__ import annotations

import logging
from typing import Any

from ..core.settings import resolve
from .state import PartialState


class MultiProcessAdapter(logging.LoggerAdapter):
    """A logger adapter that logs on the main process only, unless told otherwise.

    Each logging call takes two more keyword arguments: `main_process_only=False` logs on every process,
    and `in_order=True` (with it) makes the processes log one after the other, in rank order. It is
    built as a `logging.LoggerAdapter` is, from a logger and optional extra context; `get_logger`
    builds it for you.
    """

    @staticmethod
    def _should_log(main_process_only: bool) -> bool:

        state = PartialState()
        return not main_process_only or state.is_main_process

    def process(self, msg: Any, kwargs: Any) -> tuple[Any, Any]:
        """Prefix the message with `[RANK n] `, as Accelerate does.

        Args:
            msg (str): The message.
            kwargs (dict): The logging call's keywords.

        Returns:
            tuple[str, dict]: The message and keywords.
        """

        msg, kwargs = super().process(msg, kwargs)
        return f"[RANK {PartialState().process_index}] {msg}", kwargs

    def log(self, level: int, msg: Any, *args: Any, **kwargs: Any) -> None:
        """Log `msg` at `level` on the main process (or everywhere, see the class).

        Args:
            level (int): The logging level.
            msg (str): The message.
            *args: Its %-format arguments.
            **kwargs: `main_process_only` (default True), `in_order` (default False), and the keywords of
                `logging.Logger.log`.

        Raises:
            RuntimeError: No `PartialState` exists yet (create the Accelerator first).
        """

        if not PartialState._shared_state:
            raise RuntimeError(
                "Cadence's logger needs the process state: create an Accelerator() or PartialState() "
                "before logging."
            )
        main_process_only = kwargs.pop("main_process_only", True)
        in_order = kwargs.pop("in_order", False)
        kwargs.setdefault("stacklevel", 2)
        if not self.isEnabledFor(level):
            return
        msg, kwargs = self.process(msg, kwargs)
        if in_order:  # main_process_only is ignored: every rank logs, one after the other
            state = PartialState()
            for rank in range(state.num_processes):
                if rank == state.process_index:
                    self.logger.log(level, msg, *args, **kwargs)
                state.wait_for_everyone()
        elif self._should_log(main_process_only):
            self.logger.log(level, msg, *args, **kwargs)

    def warning_once(self, *args: Any, **kwargs: Any) -> None:
        """Log this warning only the first time these exact arguments are seen.

        Args:
            *args: As for `warning`.
            **kwargs: As for `warning`.
        """
        key = (args, tuple(sorted(kwargs.items())))
        seen = self.__dict__.setdefault("_warned", set())
        if key not in seen:
            seen.add(key)
            self.warning(*args, **kwargs)


def get_logger(name: str, log_level: str | None = None) -> MultiProcessAdapter:
    """A logger for `name` that logs on the main process only (see `MultiProcessAdapter`).

    Args:
        name (str): The logger's name, usually `__name__`.
        log_level (str | None): Its level ("INFO", "DEBUG", ...); None reads `ACCELERATE_LOG_LEVEL`,
            else leaves the level unset.

    Returns:
        MultiProcessAdapter: The logger.

    Example:
        >>> from cadence import Accelerator
        >>> from cadence.logging import get_logger
        >>> accelerator = Accelerator()
        >>> logger = get_logger("train", log_level="INFO")
        >>> logger.info("once per job")
        >>> logger.info("on every process", main_process_only=False)
    """
    if log_level is None:
        log_level = resolve("log_level", launch={}).value
    logger = logging.getLogger(name)
    if log_level is not None:
        logger.setLevel(log_level.upper())
        logger.root.setLevel(log_level.upper())
    return MultiProcessAdapter(logger, {})
