"""The Accelerator's execution control and collectives (wait_for_everyone, main_process_first, the
on_*_process decorators, triggers, gather, reduce, gather_for_metrics, ...), forwarding to the process
state and `cadence.runtime.collectives`. A base class of `Accelerator`, kept apart so the façade stays
one screenful per concern.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

from ..runtime import collectives as ops


class ProcessMethods:
    """Execution control and collectives of the Accelerator; they use its process state (and, for
    `gather_for_metrics`, its gradient state and fault tolerance)."""

    def gather_for_metrics(self, input_data: Any, use_gather_object: bool = False) -> Any:
        """Gather `input_data` from every process, for computing metrics, without the duplicated samples.

        To give every process full batches, a prepared dataloader completes the last batch with samples from
        the start of the dataset. On that last batch this drops them, so metrics count every sample exactly
        once. Tensors are concatenated along their first dimension; other objects are gathered as Python
        objects.

        Args:
            input_data (Any): A tensor, or a list/tuple/dict of tensors, or any picklable objects.
            use_gather_object (bool): Gather as Python objects (lists are concatenated) even when
                `input_data` holds only tensors (default False).

        Returns:
            The gathered data, in process order, with the padding samples removed.

        Example:
            >>> import torch
            >>> from cadence import Accelerator
            >>> accelerator = Accelerator()
            >>> loader = accelerator.prepare(torch.utils.data.DataLoader(torch.arange(5), batch_size=2))
            >>> torch.cat([accelerator.gather_for_metrics(batch) for batch in loader]).tolist()
            [0, 1, 2, 3, 4]
        """
        from ..data.metrics import (
            gather_for_metrics,  # deferred: loaded on first use, keeps `import cadence` cheap
        )

        ft, loader = self._fault_tolerance, self.gradient_state.active_dataloader
        if ft is not None and ft.cuts(loader):  # the step's samples across every replica group
            return ft.gather_for_metrics(input_data, use_gather_object, self.process_index)
        if ft is not None:  # an evaluation pass, kept for a group that comes back (or replayed)
            return ft.evaluation_gather(
                lambda: gather_for_metrics(input_data, use_gather_object=use_gather_object)
            )
        return gather_for_metrics(input_data, use_gather_object=use_gather_object)

    # -- execution control and collectives (the process state and cadence.runtime.collectives) --------------------
    def wait_for_everyone(self, timeout: float | timedelta | None = None) -> None:
        """Block until every process reaches this call (a barrier); returns at once on one process.

        Args:
            timeout (float | datetime.timedelta | None): Give up after this long (seconds or a timedelta)
                with an error; None waits up to the process group's timeout. A negative or non-numeric
                value raises ValueError, on one process too.

        Example:
            >>> from cadence import Accelerator
            >>> accelerator = Accelerator()
            >>> accelerator.wait_for_everyone()
        """
        self.state.partial_state.wait_for_everyone(timeout)

    @contextmanager
    def main_process_first(self) -> Iterator[None]:
        """Run the block on the main process first, then on all the others together.

        For work the others can reuse once it exists: downloading or preprocessing a dataset into a cache.

        Example:
            >>> from cadence import Accelerator
            >>> accelerator = Accelerator()
            >>> with accelerator.main_process_first():
            ...     data = list(range(4))  # e.g. load_dataset(...), cached by the main process
        """
        with self.state.partial_state.main_process_first():
            yield

    @contextmanager
    def local_main_process_first(self) -> Iterator[None]:
        """Run the block on each machine's local main process first, then on that machine's other processes."""
        with self.state.partial_state.local_main_process_first():
            yield

    @contextmanager
    def split_between_processes(self, inputs: Any, apply_padding: bool = False) -> Iterator[Any]:
        """Give this process its contiguous share of `inputs` inside the block (for distributed inference).

        Args:
            inputs (list | tuple | dict | torch.Tensor): What to split. A dict is split value by value
                (every value must have the same length); a tensor along its first dimension.
            apply_padding (bool): Repeat the last item so that every process gets as many items, which
                `gather` needs (default False: the first processes get one more item).

        Yields:
            This process's share, of the same type as `inputs`.

        Example:
            >>> from cadence import Accelerator
            >>> accelerator = Accelerator()
            >>> with accelerator.split_between_processes(["a", "b", "c"]) as prompts:
            ...     prompts  # on 2 processes: ['a', 'b'] on the first, ['c'] on the second
            ['a', 'b', 'c']
        """
        with self.state.partial_state.split_between_processes(inputs, apply_padding) as part:
            yield part

    def on_main_process(self, function: Callable | None = None) -> Callable:
        """Decorator: run the decorated function only on the main process (it returns None elsewhere).

        Args:
            function (Callable | None): What to run on rank 0.

        Returns:
            Callable: `function`, returning None on the other processes.

        Example:
            >>> from cadence import Accelerator
            >>> accelerator = Accelerator()
            >>> @accelerator.on_main_process
            ... def report():
            ...     print("only once")
            >>> report()
            only once
        """
        return self.state.partial_state.on_main_process(function)

    def on_local_main_process(self, function: Callable | None = None) -> Callable:
        """Decorator: run the decorated function only on each machine's local main process.

        Args:
            function (Callable | None): What to run on local rank 0 of each machine.

        Returns:
            Callable: `function`, returning None on the other processes.
        """
        return self.state.partial_state.on_local_main_process(function)

    def on_last_process(self, function: Callable | None = None) -> Callable:
        """Decorator: run the decorated function only on the last process.

        Args:
            function (Callable | None): What to run on rank `num_processes - 1`.

        Returns:
            Callable: `function`, returning None on the other processes.
        """
        return self.state.partial_state.on_last_process(function)

    def on_process(
        self, function: Callable | None = None, process_index: int | None = None
    ) -> Callable:
        """Decorator: run the decorated function only on the process of rank `process_index`.

        Args:
            function (Callable | None): What to run; leave it out to get a decorator
                (`@accelerator.on_process(process_index=1)`).
            process_index (int | None): The global rank that runs it.

        Returns:
            Callable: `function`, returning None on the other ranks; a decorator without `function`.
        """
        return self.state.partial_state.on_process(function, process_index=process_index)

    def on_local_process(
        self,
        function: Callable | None = None,
        local_process_index: int | None = None,
        **kwargs: Any,
    ) -> Callable:
        """Decorator: run the decorated function only on local rank `local_process_index` of each machine.

        Args:
            function (Callable | None): What to run; leave it out to get a decorator.
            local_process_index (int | None): The local rank that runs it on each machine.
            **kwargs: Accelerate's spelling `local_process_idx=` is accepted for `local_process_index`.

        Returns:
            Callable: `function`, returning None on the other ranks; a decorator without `function`.
        """
        return self.state.partial_state.on_local_process(
            function, local_process_index=local_process_index, **kwargs
        )

    def print(self, *args: Any, **kwargs: Any) -> None:
        """`print` once per machine (on each local main process), so logs are not repeated by every process.

        Args:
            *args: What to print, as for `print`.
            **kwargs: `print`'s keyword arguments (`sep`, `end`, `file`, `flush`).
        """
        self.state.partial_state.print(*args, **kwargs)

    def set_trigger(self) -> None:
        """Raise this process's flag; the next `check_trigger()` returns True on every process.

        Use it to stop all processes together when one of them decides to (early stopping, a NaN loss)
        without a collective on every step.
        """
        self.state.partial_state.set_trigger()

    def check_trigger(self) -> bool:
        """Whether any process called `set_trigger()` since the last check; the flag is then cleared.

        Every process must call it at the same point (it is a collective).

        Returns:
            bool: The same answer on every process.

        Example:
            >>> from cadence import Accelerator
            >>> accelerator = Accelerator()
            >>> accelerator.set_trigger()
            >>> accelerator.check_trigger(), accelerator.check_trigger()
            (True, False)
        """
        return self.state.partial_state.check_trigger()

    def gather(self, tensor: Any) -> Any:
        """Concatenate `tensor` from every process along its first dimension, on every process.

        Every process must pass tensors of the same shape (use `pad_across_processes` first otherwise).
        For evaluation use `gather_for_metrics`, which also drops the padding samples of the last batch.

        Args:
            tensor (torch.Tensor | list | tuple | dict): A tensor or a nested structure of tensors.

        Returns:
            The same structure with each tensor gathered (`num_processes` times longer).

        Example:
            >>> import torch
            >>> from cadence import Accelerator
            >>> accelerator = Accelerator()
            >>> accelerator.gather(torch.tensor([accelerator.process_index])).tolist()
            [0]
        """
        return ops.gather(tensor)

    def reduce(self, tensor: Any, reduction: str = "sum", scale: float = 1.0) -> Any:
        """Reduce `tensor` across processes, so every process holds the result.

        Args:
            tensor (torch.Tensor | list | tuple | dict): A tensor or a nested structure of tensors.
            reduction (str): "sum" (default), "mean" or "none".
            scale (float): Multiply the result by this factor (default 1.0).

        Returns:
            The reduced data, of the same structure.
        """
        return ops.reduce(tensor, reduction, scale)

    def pad_across_processes(
        self, tensor: Any, dim: int = 0, pad_index: Any = 0, pad_first: bool = False
    ) -> Any:
        """Pad `tensor` along `dim` to the largest size any process has, so that it can be gathered.

        Args:
            tensor (torch.Tensor | list | tuple | dict): A tensor or a nested structure of tensors.
            dim (int): The dimension to pad (default 0).
            pad_index (int | float): The value of the padding (default 0).
            pad_first (bool): Pad at the start instead of the end (default False).

        Returns:
            The padded data, of the same structure.
        """
        return ops.pad_across_processes(tensor, dim=dim, pad_index=pad_index, pad_first=pad_first)
