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
    """Create the parameters of every module built inside the block directly on `device`.

    Args:
        device (str | torch.device): Where parameters go ("cuda:0", "cpu", "meta", ...).
        include_buffers (bool | None): Put buffers there too (then every tensor created in the block
            lands on `device`). None reads `ACCELERATE_INIT_INCLUDE_BUFFERS` (default False).

    Example:
        >>> import torch
        >>> from cadence.big_modeling import init_on_device
        >>> with init_on_device("meta"):
        ...     layer = torch.nn.Linear(100, 100)
        >>> layer.weight.is_meta
        True
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
    """Build models inside the block without allocating their weights (parameters go to the meta device).

    Every parameter registered in the block is created on PyTorch's "meta" device: it has a shape and a
    dtype but no memory, so a model of any size is built at once. Load real weights afterwards with
    `load_checkpoint_and_dispatch` (or `load_checkpoint_in_model`); until then the model cannot run.

    Args:
        include_buffers (bool | None): Put buffers (BatchNorm statistics, ...) on the meta device too.
            None reads `ACCELERATE_INIT_INCLUDE_BUFFERS` (default False: buffers stay on the CPU, as
            they are small and often not in checkpoints).

    Example:
        >>> import torch
        >>> from cadence import init_empty_weights
        >>> with init_empty_weights():
        ...     model = torch.nn.Sequential(*[torch.nn.Linear(10_000, 10_000) for _ in range(100)])
        >>> model[0].weight.device  # 40 GB of fp32 weights, none allocated
        device(type='meta')
    """
    with init_on_device(torch.device("meta"), include_buffers=include_buffers) as context:
        yield context
