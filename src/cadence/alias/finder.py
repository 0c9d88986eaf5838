"""The import side of the alias: `accelerate` and `accelerate.<path>` resolve to Cadence's modules."""

from __future__ import annotations

import importlib
import importlib.machinery
import importlib.util
import sys
import types
import warnings
from collections.abc import Sequence
from typing import Any

REFERENCE_NAME = "accelerate"
REFERENCE_VERSION = "1.15.0"  # the reference release whose public API Cadence matches
TARGET_NAME = "cadence"

_warned_about_reference = False


class AccelerateFacade(types.ModuleType):
    """The `accelerate` module itself: every attribute is read from `cadence`, except `__version__`,
    which is Accelerate version Cadence matches (peft, TRL and diffusers compare it)."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return getattr(importlib.import_module(TARGET_NAME), name)

    def __dir__(self) -> list[str]:
        return sorted(set(dir(importlib.import_module(TARGET_NAME))) | set(vars(self)))


class _AliasLoader:
    """Loads `accelerate.<path>` as the module object `cadence.<path>`."""

    def __init__(self, target: str) -> None:
        self.target = target

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType | None:
        if spec.name == REFERENCE_NAME:
            return AccelerateFacade(REFERENCE_NAME)
        return (
            None  # a placeholder, replaced in exec_module (keeps the Cadence module's own __spec__)
        )

    def exec_module(self, module: types.ModuleType) -> None:
        target = importlib.import_module(self.target)
        if isinstance(module, AccelerateFacade):
            module.__version__ = REFERENCE_VERSION
            module.__file__ = target.__file__
            module.__path__ = list(target.__path__)
            module.__doc__ = target.__doc__
            return
        # The import system returns whatever sys.modules holds under the name once the loader is
        # done: the Cadence module itself, so both names give one object (isinstance, mock.patch).
        sys.modules[module.__name__] = target


class AccelerateAliasFinder:
    """Finds `accelerate` and `accelerate.<path>` where `cadence` and `cadence.<path>` exist."""

    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None = None,
        target: types.ModuleType | None = None,
    ) -> importlib.machinery.ModuleSpec | None:
        """A spec loading `cadence.<path>` for `accelerate.<path>`; None for any other name."""
        if fullname != REFERENCE_NAME and not fullname.startswith(REFERENCE_NAME + "."):
            return None
        target_name = TARGET_NAME + fullname[len(REFERENCE_NAME) :]
        try:
            target_spec = importlib.util.find_spec(target_name)
        except ModuleNotFoundError:
            return None
        if target_spec is None:
            return None
        if fullname == REFERENCE_NAME:
            _warn_if_reference_installed()
        locations = target_spec.submodule_search_locations
        spec = importlib.machinery.ModuleSpec(
            fullname,
            _AliasLoader(target_name),
            origin=target_spec.origin,
            is_package=locations is not None,
        )
        if locations is not None:
            spec.submodule_search_locations = list(locations)
        return spec


def _warn_if_reference_installed() -> None:
    # The user opted in, so Cadence wins; say it once per process, naming what is hidden.
    global _warned_about_reference
    if _warned_about_reference:
        return
    _warned_about_reference = True
    found = importlib.machinery.PathFinder.find_spec(REFERENCE_NAME)
    if found is not None:
        warnings.warn(
            f"CADENCE_AS_ACCELERATE is on: `import accelerate` gives Cadence; the accelerate installed "
            f"at {found.origin} is not used. Unset CADENCE_AS_ACCELERATE to use it.",
            UserWarning,
            stacklevel=3,
        )


def forget_aliased_modules() -> None:
    """Drop `accelerate` and `accelerate.<path>` from `sys.modules` (the Cadence modules stay)."""
    for name in [
        n for n in sys.modules if n == REFERENCE_NAME or n.startswith(REFERENCE_NAME + ".")
    ]:
        module = sys.modules[name]
        if isinstance(module, AccelerateFacade) or getattr(module, "__name__", "").startswith(
            TARGET_NAME
        ):
            del sys.modules[name]
