"""Small building blocks of the process-wide state objects (no cadence imports)."""

from __future__ import annotations

import threading
from typing import Any


class ThreadLocalSharedDict(threading.local):
    """A dict-like holder for singleton state, with one storage per thread (needed where each device
    runs in its own thread, as on TPU).

    Example:
        >>> shared = ThreadLocalSharedDict()
        >>> shared["x"] = 1; shared.get("x")
        1

    Args:
        thread_local (bool): Accepted for Accelerate's signature; the storage is per thread whatever its
            value (the holder is a `threading.local`).
    """

    def __init__(self, thread_local: bool = False) -> None:
        self._storage: dict[str, Any] = {}

    def __get__(self, obj: Any, objtype: Any = None) -> dict[str, Any]:
        return self._storage

    def __set__(self, obj: Any, value: dict[str, Any]) -> None:
        self._storage = value

    def __getitem__(self, key: str) -> Any:
        return self._storage[key]

    def __setitem__(self, key: str, value: Any) -> None:
        self._storage[key] = value

    def __contains__(self, key: object) -> bool:
        return key in self._storage

    def __len__(self) -> int:
        return len(self._storage)

    def get(self, key: str, default: Any = None) -> Any:
        """The value stored under `key`, or `default`.

        Args:
            key (str): The name of the entry.
            default (Any): What to return when there is no such entry (default None).
        """
        return self._storage.get(key, default)

    def clear(self) -> None:
        """Forget everything stored."""
        self._storage.clear()


def do_nothing(*args: Any, **kwargs: Any) -> None:
    """Accept any arguments and do nothing (a placeholder callback).

    Args:
        *args: Ignored.
        **kwargs: Ignored.
    """
    return None
