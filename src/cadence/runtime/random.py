"""Seeding and RNG synchronisation across processes."""

from __future__ import annotations

import random

import numpy as np
import torch

from ..core.enums import RNGType
from ..xla import runtime as xla_runtime
from .collectives import broadcast
from .state import PartialState


def set_seed(seed: int, device_specific: bool = False, deterministic: bool = False) -> None:
    """Seed Python's, NumPy's and PyTorch's random generators (and CUDA's) on this process.

    Call it before building the model so every process starts from the same weights; seeded dataloaders
    (`use_seedable_sampler`) read it too.

    Args:
        seed (int): The seed.
        device_specific (bool): Add the process index to the seed, so each process draws differently
            (for data augmentation; default False).
        deterministic (bool): Also ask PyTorch for deterministic algorithms (slower; default False).

    Example:
        >>> import torch
        >>> from cadence.utils import set_seed
        >>> set_seed(42)
        >>> first = torch.rand(1)
        >>> set_seed(42)
        >>> bool(torch.equal(first, torch.rand(1)))
        True
    """
    if device_specific:
        seed += PartialState().process_index
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
    # Lazy in torch (applied when CUDA initialises): asking `is_available()` here would create the
    # CUDA driver state that breaks notebook_launcher's fork.
    torch.cuda.manual_seed_all(seed)
    if xla_runtime.loaded():  # the XLA generator too, once torch_xla is in use
        xla_runtime.set_rng_state(seed)
    if deterministic:
        torch.use_deterministic_algorithms(True)


def synchronize_rng_state(
    rng_type: RNGType | str | None = None, generator: torch.Generator | None = None
) -> None:
    """Give every process the main process's state of one random number generator.

    Args:
        rng_type (RNGType | str | None): "torch", "cuda", "xla" or "generator".
        generator (torch.Generator | None): The generator, for "generator".
    """

    state = PartialState()
    if not state.use_distributed:
        return
    rng_type = RNGType(rng_type)
    if rng_type == RNGType.TORCH:
        rng_state = torch.get_rng_state()
    elif rng_type == RNGType.CUDA:
        rng_state = torch.cuda.get_rng_state()
    elif rng_type == RNGType.GENERATOR:
        if generator is None:
            raise ValueError(
                "synchronize_rng_state(RNGType.GENERATOR) needs the generator to synchronise."
            )
        rng_state = generator.get_state()
    elif rng_type == RNGType.XLA and xla_runtime.loaded():
        seed = xla_runtime.get_rng_state()  # an unsigned 64-bit seed, carried as int64
        rng_state = torch.tensor([seed - 2**64 if seed >= 2**63 else seed], dtype=torch.int64)
    else:
        raise ValueError(f"RNG type {rng_type.value!r} is not available on this machine.")

    rng_state = rng_state.to(state.device)
    broadcast(rng_state, from_process=0)
    rng_state = rng_state.cpu()
    if rng_type == RNGType.TORCH:
        torch.set_rng_state(rng_state)
    elif rng_type == RNGType.XLA:
        xla_runtime.set_rng_state(int(rng_state[0]) % 2**64)
    elif rng_type == RNGType.CUDA:
        torch.cuda.set_rng_state(rng_state)
    else:
        generator.set_state(rng_state)


def synchronize_rng_states(
    rng_types: list[RNGType | str], generator: torch.Generator | None = None
) -> None:
    """Give every process the main process's state of each generator named in `rng_types`.

    Prepared dataloaders call it at the start of each epoch (the Accelerator's `rng_types`).

    Args:
        rng_types (list[RNGType | str]): Any of "torch", "cuda", "xla", "generator".
        generator (torch.Generator | None): The generator, for "generator".
    """
    for rng_type in rng_types:
        synchronize_rng_state(RNGType(rng_type), generator=generator)
