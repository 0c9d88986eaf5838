"""Local SGD: processes train without synchronising gradients and average their parameters every
`local_sgd_steps` optimizer steps (fewer collectives; useful on slow interconnects)."""

from __future__ import annotations

from types import TracebackType
from typing import TYPE_CHECKING, Any

import torch

from ..core.enums import DistributedType

if TYPE_CHECKING:
    from . import Accelerator

_SUPPORTED = (
    DistributedType.NO,
    DistributedType.MULTI_CPU,
    DistributedType.MULTI_GPU,
    DistributedType.MULTI_XPU,
)


class LocalSGD:
    """Train without synchronising gradients, and average the parameters every `local_sgd_steps` steps.

    Each process trains its own copy of the model; every `local_sgd_steps` calls of `step()`, and when
    the block ends, the parameters are averaged over the processes. Fewer collectives than DDP: useful on
    slow networks. Works with DDP on CPUs and GPUs (not DeepSpeed or FSDP); on one process it does nothing.

    Args:
        accelerator (Accelerator): The Accelerator that prepared the model.
        model (torch.nn.Module): The prepared model.
        local_sgd_steps (int): Steps between two averagings. Below 1 raises ValueError.
        enabled (bool): Turn it off without changing the code (default True).

    Raises:
        NotImplementedError: DeepSpeed, FSDP or another unsupported distributed type.
        ValueError: `local_sgd_steps` below 1.

    Example:
        >>> import torch
        >>> from cadence import Accelerator
        >>> from cadence.local_sgd import LocalSGD
        >>> accelerator = Accelerator()
        >>> model = torch.nn.Linear(2, 1)
        >>> optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        >>> loader = torch.utils.data.DataLoader(torch.randn(16, 2), batch_size=4)
        >>> model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
        >>> with LocalSGD(accelerator, model, local_sgd_steps=8) as local_sgd:
        ...     for batch in loader:
        ...         loss = model(batch).sum()
        ...         accelerator.backward(loss)
        ...         optimizer.step(); optimizer.zero_grad()
        ...         local_sgd.step()
    """

    def __init__(
        self,
        accelerator: Accelerator,
        model: torch.nn.Module,
        local_sgd_steps: int,
        enabled: bool = True,
    ) -> None:
        if accelerator.distributed_type not in _SUPPORTED:
            raise NotImplementedError(
                "LocalSGD is supported only for CPUs and GPUs without DeepSpeed, FSDP or Megatron-LM "
                f"(distributed type {accelerator.distributed_type})."
            )
        if int(local_sgd_steps) < 1:
            raise ValueError(
                f"local_sgd_steps must be a positive number of steps, got {local_sgd_steps}."
            )
        self.enabled = enabled and accelerator.distributed_type != DistributedType.NO
        self.num_steps = 0
        self.accelerator = accelerator
        self.model = model
        self.local_sgd_steps = int(local_sgd_steps)
        self._no_sync: Any = None

    def __enter__(self) -> LocalSGD:
        if self.enabled:
            self._no_sync = self.accelerator.no_sync(self.model)
            self._no_sync.__enter__()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc_value: BaseException | None,
        traceback: TracebackType | None,
    ) -> bool | None:
        if not self.enabled:
            return None
        if exc_type is None:
            self._average_parameters()  # leave with every process holding the same model
        return self._no_sync.__exit__(exc_type, exc_value, traceback)

    def step(self) -> None:
        """Count one optimizer step; every `local_sgd_steps` steps, average the parameters."""
        self.num_steps += 1
        if self.enabled and self.num_steps % self.local_sgd_steps == 0:
            self._average_parameters()

    def _average_parameters(self) -> None:
        self.accelerator.wait_for_everyone()
        with self.accelerator.autocast(), torch.no_grad():
            for parameter in self.model.parameters():
                parameter.data = self.accelerator.reduce(parameter.data, reduction="mean")
