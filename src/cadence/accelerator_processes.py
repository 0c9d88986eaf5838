"""The Accelerator's execution-control and collective methods (a mixin of Accelerator)."""

from __future__ import annotations

from contextlib import contextmanager
from datetime import timedelta
from typing import Any

from . import ops


class ProcessControlMethods:
    """wait_for_everyone, *_first, split_between_processes, on_* decorators, triggers, collectives."""

    # -- execution control ------------------------------------------------------------------------
    def wait_for_everyone(self, timeout: float | timedelta | None = None) -> None:
        """Block until every process reaches this point (nothing happens on one process)."""
        self.state.partial_state.wait_for_everyone(timeout)

    @contextmanager
    def main_process_first(self):
        with self.state.partial_state.main_process_first():
            yield

    @contextmanager
    def local_main_process_first(self):
        with self.state.partial_state.local_main_process_first():
            yield

    @contextmanager
    def split_between_processes(self, inputs: Any, apply_padding: bool = False):
        with self.state.partial_state.split_between_processes(inputs, apply_padding) as part:
            yield part

    def on_main_process(self, function=None):
        return self.state.partial_state.on_main_process(function)

    def on_local_main_process(self, function=None):
        return self.state.partial_state.on_local_main_process(function)

    def on_last_process(self, function=None):
        return self.state.partial_state.on_last_process(function)

    def on_process(self, function=None, process_index: int | None = None):
        return self.state.partial_state.on_process(function, process_index=process_index)

    def on_local_process(
        self, function=None, local_process_index: int | None = None, **kwargs: Any
    ):
        return self.state.partial_state.on_local_process(
            function, local_process_index=local_process_index, **kwargs
        )

    def print(self, *args: Any, **kwargs: Any) -> None:
        """`print`, once per machine."""
        self.state.partial_state.print(*args, **kwargs)

    def set_trigger(self) -> None:
        """Raise this process's flag; the next `check_trigger` on every process sees it."""
        self.state.partial_state.set_trigger()

    def check_trigger(self) -> bool:
        """True on every process if any process called `set_trigger` (then the flag resets)."""
        return self.state.partial_state.check_trigger()

    # -- collectives --------------------------------------------------------------------------------
    def gather(self, tensor: Any) -> Any:
        return ops.gather(tensor)

    def reduce(self, tensor: Any, reduction: str = "sum", scale: float = 1.0) -> Any:
        return ops.reduce(tensor, reduction, scale)

    def pad_across_processes(
        self, tensor: Any, dim: int = 0, pad_index: Any = 0, pad_first: bool = False
    ) -> Any:
        return ops.pad_across_processes(tensor, dim=dim, pad_index=pad_index, pad_first=pad_first)
