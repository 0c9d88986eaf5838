"""The restart generation of a worker: the rendezvous round it was started in.

`cadence launch`'s agent sets ``CADENCE_RESTART_GENERATION`` for each worker group it starts (the
c10d rendezvous round, the same on every node; torch elastic's restart count where there is no
round). The side channel keys its records by it and checkpoint fencing (checkpointing/generation.py)
refuses writes from an older one.
"""

from __future__ import annotations

from ..core.settings import env_text

GENERATION_ENV = "CADENCE_RESTART_GENERATION"


def current_generation() -> int | None:
    """This worker's generation, or None outside an elastic launch."""
    text = env_text(GENERATION_ENV) or env_text("TORCHELASTIC_RESTART_COUNT")
    return int(text) if text and text.strip().isdigit() else None
