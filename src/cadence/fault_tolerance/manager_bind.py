"""torchft's Manager server bound to the address given (Cadence's rule for every listener)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any


@contextlib.contextmanager
def manager_server_bound_to(host: str) -> Iterator[None]:
    """torchft 0.2.0's Manager starts its ManagerServer on `[::]` (every interface) and takes no
    bind argument; Cadence's rule is that listeners bind to the address given, so while the Manager
    is built its server class is replaced by one that binds `host` (port chosen by the system)."""
    import torchft.manager as manager_module

    original = manager_module.ManagerServer

    def bound(**kwargs: Any) -> Any:
        kwargs["bind"] = f"{host}:0" if ":" not in host else f"[{host}]:0"
        return original(**kwargs)

    manager_module.ManagerServer = bound  # type: ignore[assignment]
    try:
        yield
    finally:
        manager_module.ManagerServer = original
