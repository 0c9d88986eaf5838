"""The side channel: the c10d store the process group was created with, which works while it is blocked.

Keys live under a prefix unique to this run, restart and process group, so an elastic restart or a new
process group never reads stale states: ``rank/<r>`` holds rank r's latest state (JSON), ``stop`` the
first reason to stop the job (written once, with compare_set, so every rank follows the same one).
"""

from __future__ import annotations

import json
import os
from typing import Any

import torch.distributed as dist


def channel_prefix(generation: int) -> str:
    run = os.environ.get("TORCHELASTIC_RUN_ID", "run")
    restart = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    return f"cadence/watch/{run}/{restart}/{generation}/"


class SideChannel:
    def __init__(self, store: Any, prefix: str) -> None:
        self._store = dist.PrefixStore(prefix, store)

    @classmethod
    def of_default_group(cls, generation: int) -> SideChannel | None:
        try:
            store = dist.distributed_c10d._get_default_store()
        except (RuntimeError, ValueError, AttributeError):
            return None
        return cls(store, channel_prefix(generation))

    def publish(self, rank: int, state: dict[str, Any]) -> None:
        self._store.set(f"rank/{rank}", json.dumps(state))

    def states(self, world_size: int) -> list[dict[str, Any] | None]:
        """Every rank's latest state (None for a rank that has not published yet)."""
        keys = [f"rank/{rank}" for rank in range(world_size)]
        if self._store.check(keys):
            values = self._store.multi_get(keys)
        else:  # some rank has not started its watchdog yet: never `get` a missing key (it blocks)
            values = [self._store.get(key) if self._store.check([key]) else None for key in keys]
        return [json.loads(value) if value else None for value in values]

    def stop_reason(self) -> dict[str, Any] | None:
        if not self._store.check(["stop"]):
            return None
        return json.loads(self._store.get("stop"))

    def claim_stop(self, reason: dict[str, Any]) -> dict[str, Any]:
        """Record `reason` unless another rank recorded one first; return the one that stands."""
        return json.loads(self._store.compare_set("stop", "", json.dumps(reason)))
