"""Module-level `__getattr__` / `__dir__` that import a public name from its home on first use.

Public namespaces (`cadence`, `cadence.utils`, `cadence.plugins`) list their names in a table, so that
`import cadence` does not import every part of the package.

Example::

    _EXPORTS = {"Accelerator": "cadence.accelerator"}
    __getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable
from typing import Any


def lazy_exports(
    module_name: str,
    exports: dict[str, str],
    aliases: dict[str, str] | None = None,
    submodules: tuple[str, ...] = (),
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The `__getattr__` and `__dir__` of module `module_name` for the names in `exports`.

    `exports` maps a public name to the module that defines it; `aliases` maps a public name to the
    name it has in that module; `submodules` are submodules that become attributes on first use (as
    the reference's package exposes them once imported). A resolved name is cached in the module's
    globals."""
    aliases = aliases or {}
    names = sorted(set(exports) | set(submodules))

    def __getattr__(name: str) -> Any:
        home = exports.get(name)
        if home is None and name in submodules:  # an exported name wins over a submodule's
            return importlib.import_module(f"{module_name}.{name}")  # the import sets the attribute
        if home is None:
            raise AttributeError(f"module {module_name!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(home), aliases.get(name, name))
        setattr(sys.modules[module_name], name, value)
        return value

    def __dir__() -> list[str]:
        return names

    return __getattr__, __dir__
