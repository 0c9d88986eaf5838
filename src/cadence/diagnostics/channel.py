"""The side channel: the c10d store the process group was created with, which works while it is blocked.

Keys live under a prefix unique to this run, restart and process group, so an elastic restart or a new
process group never reads stale states: ``rank/<r>`` holds rank r's latest state (JSON), ``stop`` the
first reason to stop the job (written once, with compare_set, so every rank follows the same one).
Every value is signed with the job's token (see signing.py); values that do not verify are ignored.
"""

from __future__ import annotations

import json
from typing import Any

import torch.distributed as dist

from ..core.settings import env_text
from .generation_env import GENERATION_ENV
from .signing import RecordSigner

# compare_set attempts when a forged value sits under a key this job writes once ("stop").
_REPLACE_FORGERIES = 4


def channel_prefix(generation: int) -> str:
    """Store key prefix of the side channel for this run, restart and `generation`."""
    run = env_text("TORCHELASTIC_RUN_ID", "run")
    # The rendezvous round (set by cadence launch's agent) is the same on every node; the restart
    # count is not (a node that joined later has restarted fewer times).
    restart = env_text(GENERATION_ENV) or env_text("TORCHELASTIC_RESTART_COUNT", "0")
    return f"cadence/watch/{run}/{restart}/{generation}/"


class SideChannel:
    """Signed key-value records shared by the ranks through the rendezvous store."""

    def __init__(self, store: Any, prefix: str, signer: RecordSigner | None = None) -> None:
        self._store = dist.PrefixStore(prefix, store)
        self._prefix = prefix
        self.signer = signer if signer is not None else RecordSigner.from_environment()
        # Ranks whose state was present but did not verify at the last `states()` read.
        self.last_unverified: list[int] = []

    @classmethod
    def of_default_group(cls, generation: int) -> SideChannel | None:
        """Side channel on the default process group's store, or None when there is none."""
        try:
            store = dist.distributed_c10d._get_default_store()
        except (RuntimeError, ValueError, AttributeError):
            return None
        return cls(store, channel_prefix(generation))

    # -- signed values ---------------------------------------------------------------------------
    def _signed_name(self, key: str) -> str:
        # The key as the store spells it below the process group's own prefix (PrefixStore adds "/").
        return f"{self._prefix}/{key}"

    def _sealed(self, key: str, record: dict[str, Any]) -> str:
        return self.signer.sign(self._signed_name(key), json.dumps(record))

    def _opened(self, key: str, value: Any) -> dict[str, Any] | None:
        if not value:
            return None
        payload = self.signer.open(self._signed_name(key), value)
        if payload is None:
            return None
        try:
            record = json.loads(payload)
        except ValueError:
            return None
        return record if isinstance(record, dict) else None

    def put(self, key: str, record: dict[str, Any]) -> None:
        """Sign `record` and write it under `key`."""
        self._store.set(key, self._sealed(key, record))

    def get(self, key: str) -> dict[str, Any] | None:
        """The authentic record under `key`, or None (missing or not authentic)."""
        if not self._store.check([key]):
            return None
        return self._opened(key, self._store.get(key))

    def claim(self, key: str, record: dict[str, Any]) -> tuple[dict[str, Any], bool]:
        """Write `record` under `key` unless an authentic record is there already; return the record
        that stands and whether it is ours. A forged value in the way is replaced."""
        mine = self._sealed(key, record)
        expected = ""
        for _ in range(_REPLACE_FORGERIES):
            standing = self._store.compare_set(key, expected, mine)
            text = standing.decode(errors="replace") if isinstance(standing, bytes) else standing
            if text == mine:
                return record, True
            opened = self._opened(key, standing)
            if opened is not None:
                return opened, False
            expected = text  # someone without the token wrote here: take the key back
        return record, True

    # -- the watchdog's records ------------------------------------------------------------------
    def publish(self, rank: int, state: dict[str, Any]) -> None:
        """Publish `state` as the latest state of `rank`."""
        self.put(f"rank/{rank}", state)

    def states(self, world_size: int) -> list[dict[str, Any] | None]:
        """Every rank's latest authentic state (None for a rank that has not published yet)."""
        keys = [f"rank/{rank}" for rank in range(world_size)]
        if self._store.check(keys):
            values = self._store.multi_get(keys)
        else:  # some rank has not started its watchdog yet: never `get` a missing key (it blocks)
            values = [self._store.get(key) if self._store.check([key]) else None for key in keys]
        states = [self._opened(key, value) for key, value in zip(keys, values)]
        self.last_unverified = [
            rank
            for rank, (value, state) in enumerate(zip(values, states))
            if value and state is None
        ]
        return states

    def stop_reason(self) -> dict[str, Any] | None:
        """The authentic stop record, or None when no stop was requested."""
        return self.get("stop")

    def claim_stop(self, reason: dict[str, Any]) -> dict[str, Any]:
        """Record `reason` unless another rank recorded one first; return the one that stands."""
        return self.claim("stop", reason)[0]
