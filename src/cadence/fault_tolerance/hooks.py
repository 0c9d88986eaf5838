"""The hooks a fault-tolerant session puts on the user's model and parameters."""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any


class SessionHook:
    """A hook the session puts on the user's model or parameters: it calls the session's method
    while the session lives. A copy of the model (`copy.deepcopy`, an EMA) shares it rather than
    copying the session (its threads and servers), and a pickled model carries a hook that does
    nothing (a session belongs to one process).

    Args:
        session: the session (held weakly: the user's model does not keep it alive).
        method: the name of the session's method the hook calls.
    """

    def __init__(self, session: Any, method: str) -> None:
        self._session = weakref.ref(session)
        self._method = method

    def __call__(self, *args: Any) -> None:
        session = self._session()
        if session is not None:
            getattr(session, self._method)(*args)

    def __deepcopy__(self, memo: dict[int, Any]) -> SessionHook:
        return self

    def __reduce__(self) -> tuple[Any, tuple[()]]:
        return (_inert_hook, ())


def _inert_hook() -> Callable[..., None]:
    return _do_nothing


def _do_nothing(*args: Any) -> None:
    return None
