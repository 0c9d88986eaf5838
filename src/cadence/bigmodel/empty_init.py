"""Building a model without allocating its weights: `init_empty_weights` / `init_on_device`."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Optional, Union

import torch
from torch import nn

from ..core.settings import env_bool


def _include_buffers_default() -> bool:
    return env_bool("ACCELERATE_INIT_INCLUDE_BUFFERS", False)


@contextlib.contextmanager
def init_on_device(
    device: Union[str, torch.device], include_buffers: Optional[bool] = None
) -> Iterator[None]:
    """Inside the block, the parameters of every module created are put on `device` as soon as they are
    registered (and the buffers too with `include_buffers=True`, default from the environment variable
    ACCELERATE_INIT_INCLUDE_BUFFERS).

    Example:
    ```py
    >>> with init_on_device(device=torch.device("cuda")):
    ...     tst = torch.nn.Linear(100, 100)  # on `cuda` device
    ```
    """
    if include_buffers is None:
        include_buffers = _include_buffers_default()
    device = torch.device(device)
    if include_buffers:
        # every tensor created in the block lands on `device`: torch's own device context does that
        with device:
            yield
        return

    original_register_parameter = nn.Module.register_parameter

    def register_parameter(module: nn.Module, name: str, param: Optional[nn.Parameter]) -> None:
        original_register_parameter(module, name, param)
        if param is None or param.device == device:
            # already there: keep the same object so weights tied by assignment stay tied
            return
        registered = module._parameters[name]
        moved = type(registered)(registered.to(device), requires_grad=param.requires_grad)
        moved.__dict__.update(registered.__dict__)  # attributes libraries put on parameters
        module._parameters[name] = moved

    nn.Module.register_parameter = register_parameter
    try:
        yield
    finally:
        nn.Module.register_parameter = original_register_parameter


@contextlib.contextmanager
def init_empty_weights(include_buffers: Optional[bool] = None) -> Iterator[None]:
    """Inside the block, models are created with their parameters on the meta device: shapes and
    dtypes without memory, so any size of model is built instantly (then load it with
    `load_checkpoint_and_dispatch`). Buffers stay on the CPU unless `include_buffers=True`.

    Example:
    ```py
    >>> with init_empty_weights():
    ...     tst = torch.nn.Sequential(*[torch.nn.Linear(10000, 10000) for _ in range(1000)])
    ```
    """
    with init_on_device(torch.device("meta"), include_buffers=include_buffers) as context:
        yield context
