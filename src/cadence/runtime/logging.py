"""`get_logger`: a logger whose records are emitted on the main process only unless asked otherwise."""

from __future__ import annotations

import logging
from typing import Any

from ..core.settings import resolve
from .state import PartialState


class MultiProcessAdapter(logging.LoggerAdapter):
    """Logs on the main process only by default; `main_process_only=False` logs everywhere and
    `in_order=True` makes every rank log, one after the other."""

    @staticmethod
    def _should_log(main_process_only: bool) -> bool:

        state = PartialState()
        return not main_process_only or state.is_main_process

    def process(self, msg: Any, kwargs: Any) -> tuple[Any, Any]:
        """Prefix the message with `[RANK n] ` (every record, as the reference does)."""

        msg, kwargs = super().process(msg, kwargs)
        return f"[RANK {PartialState().process_index}] {msg}", kwargs

    def log(self, level: int, msg: Any, *args: Any, **kwargs: Any) -> None:
        """Log on the main process only, unless `main_process_only=False` (`in_order`: in turn)."""

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
        """Log this warning only the first time these exact arguments are seen."""
        key = (args, tuple(sorted(kwargs.items())))
        seen = self.__dict__.setdefault("_warned", set())
        if key not in seen:
            seen.add(key)
            self.warning(*args, **kwargs)


def get_logger(name: str, log_level: str | None = None) -> MultiProcessAdapter:
    """A logger for `name` logging on the main process (level: `log_level`/ACCELERATE_LOG_LEVEL).

    Example::

        from cadence.runtime.logging import get_logger

        logger = get_logger(__name__, log_level="INFO")
        logger.info("printed once")
        logger.info("printed by every rank", main_process_only=False)
    """
    if log_level is None:
        log_level = resolve("log_level", launch={}).value
    logger = logging.getLogger(name)
    if log_level is not None:
        logger.setLevel(log_level.upper())
        logger.root.setLevel(log_level.upper())
    return MultiProcessAdapter(logger, {})
