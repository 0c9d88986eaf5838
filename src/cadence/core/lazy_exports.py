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
import types
from collections.abc import Callable
from typing import Any

# The reference's package submodules that its namespaces expose as attributes once imported (code
# reaches them that way, `accelerate.utils.operations.gather`): Cadence's namespaces resolve them on
# first use (`lazy_exports(..., submodules=REFERENCE_SUBMODULES[__name__])`), never importing them
# with the namespace itself. Here, so that `import cadence` loads nothing more than this module.
REFERENCE_SUBMODULES: dict[str, tuple[str, ...]] = {
    "cadence": (
        "accelerator", "big_modeling", "checkpointing", "commands", "data_loader", "hooks",
        "inference", "launchers", "local_sgd", "logging", "memory_utils", "optimizer",
        "parallelism_config", "scheduler", "state", "test_utils", "tracking", "utils",
    ),
    "cadence.utils": (
        "ao", "bnb", "constants", "dataclasses", "deepspeed", "environment", "fsdp_utils",
        "imports", "launch", "megatron_lm", "memory", "modeling", "offload", "operations", "other",
        "random", "rich", "torch_xla", "transformer_engine", "versions",
    ),
}  # fmt: skip


def lazy_exports(
    module_name: str,
    exports: dict[str, str],
    aliases: dict[str, str] | None = None,
    submodules: tuple[str, ...] = (),
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The `__getattr__` and `__dir__` of module `module_name` for the names in `exports`.

    `exports` maps a public name to the module that defines it; `aliases` maps a public name to the
    name it has in that module; `submodules` are submodules that become attributes on first use (as
    Accelerate's package exposes them once imported). A resolved name is cached in the module's
    globals. An exported name stays bound to its value when a submodule of the same name is imported
    (`import cadence.utils.tqdm` leaves `cadence.utils.tqdm` the function, as in Accelerate)."""
    aliases = aliases or {}
    names = sorted(set(exports) | set(submodules))

    def resolve(name: str) -> Any:
        return getattr(importlib.import_module(exports[name]), aliases.get(name, name))

    def __getattr__(name: str) -> Any:
        if name not in exports and name in submodules:  # an exported name wins over a submodule's
            return importlib.import_module(f"{module_name}.{name}")  # the import sets the attribute
        if name not in exports:
            raise AttributeError(f"module {module_name!r} has no attribute {name!r}")
        value = resolve(name)
        setattr(sys.modules[module_name], name, value)
        return value

    class Namespace(types.ModuleType):
        """The namespace's module type: Python's import system binds a newly imported submodule on
        its parent (after the submodule's body ran, so the submodule cannot undo it); an exported
        name of the same name keeps its value instead."""

        def __setattr__(self, name: str, value: Any) -> None:
            if (
                name in exports
                and isinstance(value, types.ModuleType)
                and value.__name__ == f"{module_name}.{name}"
            ):
                value = resolve(name)
            super().__setattr__(name, value)

    sys.modules[module_name].__class__ = Namespace

    def __dir__() -> list[str]:
        return names

    return __getattr__, __dir__
