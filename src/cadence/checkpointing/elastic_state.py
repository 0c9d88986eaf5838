"""Which saved per-rank states a process loads when the number of processes changed, and the random
states of ranks the checkpoint does not have.

A checkpoint saved on N processes loads on M: replicated states (model, optimizer, ...) are the same
for every rank; rank r < N gets its own RNG state; a new rank r >= N gets a state derived from rank
0's: python, numpy and torch generators seeded with `derived_seed(rank 0's torch state, r)`, the
first 8 bytes of sha256(rank 0's torch RNG state bytes + r as 8 little-endian bytes), masked to 63
bits. Accelerator generators are seeded with the same value. The data order never depends on these:
every rank draws the epoch's order from the shared loader state (data/elastic.py).
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Mapping
from typing import Any

from .serialization import numpy_rng_record


def derived_seed(rank0_state: Mapping[str, Any], rank: int) -> int:
    """The seed of new rank `rank`, from rank 0's saved RNG state (see the module docstring)."""
    torch_state = rank0_state["torch_manual_seed"]
    data = bytes(torch_state.numpy().tobytes()) + int(rank).to_bytes(8, "little")
    return int.from_bytes(hashlib.sha256(data).digest()[:8], "little") & ((1 << 63) - 1)


def derive_rng_state(rank0_state: Mapping[str, Any], rank: int) -> dict[str, Any]:
    """An RNG state for a rank the checkpoint has none of, in capture_rng_state()'s layout."""
    import torch

    seed = derived_seed(rank0_state, rank)
    state: dict[str, Any] = {}
    if "step" in rank0_state:
        state["step"] = rank0_state["step"]  # the step counter is the same on every rank
    state["random_state"] = random.Random(seed).getstate()
    if "numpy_random_seed" in rank0_state:
        import numpy as np

        generator = np.random.RandomState(seed % (1 << 32))
        state["numpy_random_seed"] = numpy_rng_record(generator.get_state())
    state["torch_manual_seed"] = torch.Generator().manual_seed(seed).get_state()
    for key, value in rank0_state.items():
        if key.startswith("torch_") and key.endswith("_manual_seed") and key != "torch_manual_seed":
            device_type = key[len("torch_") : -len("_manual_seed")]
            module = getattr(torch, device_type, None)
            try:
                available = module is not None and module.is_available()
            except Exception:  # noqa: BLE001 - a device module that cannot tell
                available = False
            if available:
                generator = torch.Generator(device=device_type).manual_seed(seed)
                state[key] = [generator.get_state() for _ in value]
    return state


def loader_position_of(state: Any) -> Any:
    """Cadence's exact position inside a saved loader state (beside torchdata's for a stateful one)."""
    if isinstance(state, Mapping) and isinstance(state.get("_cadence_position"), Mapping):
        return state["_cadence_position"]
    return state


def has_global_position(state: Any) -> bool:
    """Whether a saved loader state records its position over all processes (Cadence >= this one)."""
    position = loader_position_of(state)
    return not (isinstance(position, Mapping) and "generator_names" in position) or isinstance(
        position.get("global"), Mapping
    )
