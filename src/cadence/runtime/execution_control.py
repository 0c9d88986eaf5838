"""The execution-control methods of `PartialState` (wait_for_everyone, main_process_first,
split_between_processes, the on_*_process decorators, print, the trigger), forwarding to
`cadence.runtime.process_control`. A base class of `PartialState`, kept apart so the state module
stays one screenful per concern.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

from . import process_control as execution


class ExecutionControl:
    """Execution control of `PartialState`; the methods use its ranks and `_current()` (the
    process's state, which may have been reset since a decorator captured it)."""

    def wait_for_everyone(self, timeout: float | timedelta | None = None) -> None:
        """Block until every process reaches this call (a barrier); returns at once on one process.

        Args:
            timeout (float | datetime.timedelta | None): Give up after this long (seconds or a timedelta)
                with an error; None waits up to the process group's timeout. A value that is not positive
                raises ValueError, on one process too.

        Example:
            >>> from cadence import PartialState
            >>> PartialState().wait_for_everyone()
        """
        execution.barrier(self, timeout)

    @contextmanager
    def main_process_first(self) -> Iterator[None]:
        """Run the block on the main process first; the others run it once the main process has left it.

        Example:
            >>> from cadence import PartialState
            >>> with PartialState().main_process_first():
            ...     cache = {"tokens": [1, 2, 3]}  # e.g. rank 0 fills a dataset cache, the rest reuse it
        """
        with execution.go_first(self, local=False):
            yield

    @contextmanager
    def local_main_process_first(self) -> Iterator[None]:
        """Run the block on each machine's local main process first; only that machine's other processes wait."""
        with execution.go_first(self, local=True):
            yield

    @contextmanager
    def split_between_processes(self, inputs: Any, apply_padding: bool = False) -> Iterator[Any]:
        """Give this process its contiguous share of `inputs` inside the block (`inputs` itself is not changed).

        Args:
            inputs (list | tuple | dict | torch.Tensor): What to split: a list or tuple by items, a tensor
                along its first dimension, a dict value by value (all values of the same length).
            apply_padding (bool): Repeat the last item so every process gets the same number of items, as
                `gather` needs (default False: the first processes get one more item each).

        Yields:
            This process's share, of the same type as `inputs`.

        Example:
            >>> from cadence import PartialState
            >>> with PartialState().split_between_processes(["a", "b", "c"]) as part:
            ...     part  # on 2 processes: ['a', 'b'] on rank 0, ['c'] on rank 1
            ['a', 'b', 'c']
        """
        yield execution.split_for_process(
            inputs, self.num_processes, self.process_index, apply_padding
        )

    def _only_where(self, function: Any, holds: Any, required_index: Any = True) -> Any:
        def predicate() -> bool:
            state = self._current()
            return not state.use_distributed or holds(state)

        return execution.run_only_if(function, predicate, required_index=required_index)

    def on_main_process(self, function: Callable | None = None) -> Callable:
        """Decorator: run the decorated function only on the main process (rank 0); elsewhere calling it does nothing and returns None.

        Args:
            function (Callable | None): The function to decorate.

        Returns:
            Callable: The decorated function.

        Example:
            >>> from cadence import PartialState
            >>> @PartialState().on_main_process
            ... def report(message):
            ...     print(message)
            >>> report("once per job")
            once per job
        """
        return self._only_where(function, lambda state: state.is_main_process)

    def on_local_main_process(self, function: Callable | None = None) -> Callable:
        """Decorator: run the decorated function only on each machine's local main process; elsewhere calling it does nothing and returns None.

        Args:
            function (Callable | None): The function to decorate.

        Returns:
            Callable: The decorated function.
        """
        return self._only_where(function, lambda state: state.is_local_main_process)

    def on_last_process(self, function: Callable | None = None) -> Callable:
        """Decorator: run the decorated function only on the last process; elsewhere calling it does nothing and returns None.

        Args:
            function (Callable | None): The function to decorate.

        Returns:
            Callable: The decorated function.
        """
        return self._only_where(function, lambda state: state.is_last_process)

    def on_process(
        self, function: Callable | None = None, process_index: int | None = None
    ) -> Callable:
        """Decorator: run the decorated function only on the process of rank `process_index`.

        Args:
            function (Callable | None): The function to decorate; None returns a decorator (write
                `@state.on_process(process_index=1)`).
            process_index (int | None): The global rank that runs it.

        Returns:
            Callable: The decorated function, or a decorator when `function` is None.
        """
        return self._only_where(
            function, lambda state: state.process_index == process_index, process_index
        )

    def on_local_process(
        self,
        function: Callable | None = None,
        local_process_index: int | None = None,
        **kwargs: Any,
    ) -> Callable:
        """Decorator: run the decorated function only on local rank `local_process_index` of each machine.

        Args:
            function (Callable | None): The function to decorate; None returns a decorator.
            local_process_index (int | None): The local rank that runs it.
            **kwargs: `local_process_idx=`, Accelerate's other spelling of `local_process_index`.

        Returns:
            Callable: The decorated function, or a decorator when `function` is None.

        Example:
            >>> from cadence import PartialState
            >>> @PartialState().on_local_process(local_process_index=0)
            ... def report():
            ...     print("local rank 0 of every machine")
            >>> report()
            local rank 0 of every machine
        """
        local_process_index = execution.take_local_index_alias(local_process_index, kwargs)
        return self._only_where(
            function,
            lambda state: state.local_process_index == local_process_index,
            local_process_index,
        )

    def print(self, *args: Any, **kwargs: Any) -> None:
        """`print` once per machine (on each local main process).

        Args:
            *args: What to print.
            **kwargs: `print`'s keyword arguments (`sep`, `end`, `file`, `flush`).
        """
        if self.is_local_main_process:
            print(*args, **kwargs)

    def set_trigger(self) -> None:
        """Raise this process's flag; the next `check_trigger()` returns True on every process."""
        execution.set_trigger(self)

    def check_trigger(self) -> bool:
        """Whether any process called `set_trigger()` since the last check; the flag is then cleared.

        Every process must call it at the same point (it is a collective).

        Returns:
            bool: The same answer on every process.
        """
        return execution.check_trigger(self)
