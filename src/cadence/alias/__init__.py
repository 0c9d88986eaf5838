"""The opt-in `accelerate` alias: with `CADENCE_AS_ACCELERATE=1`, code written for Accelerate
(transformers' Trainer, TRL, peft, diffusers) imports Cadence under Accelerate's name.

- `import accelerate` gives a thin module that reads every name from `cadence` and reports the
  reference version Cadence matches as `__version__`; `accelerate.<path>` is the very module object
  `cadence.<path>` (so `accelerate.state.PartialState is cadence.state.PartialState`).
- `importlib.metadata.version("accelerate")` / `distribution("accelerate")` answer through a finder
  that exists only while the alias is on; a listing of site-packages folders (what pip reads) is not
  answered, so pip never sees an `accelerate` installed.

The wheel ships a `.pth` startup hook that imports `cadence.alias.startup` only when the variable is
on; `cadence launch --as-accelerate` sets it for every worker; `cadence.as_accelerate()` turns the
alias on in a running interpreter (a notebook kernel).
"""

from __future__ import annotations

import os
import sys
import warnings

from cadence.alias.finder import AccelerateAliasFinder, forget_aliased_modules
from cadence.alias.metadata import AliasDistributionFinder

ENV_VAR = "CADENCE_AS_ACCELERATE"
_TRUE = ("1", "true", "yes", "on")

__all__ = [
    "ENV_VAR",
    "as_accelerate",
    "enabled_in_environment",
    "install",
    "is_installed",
    "uninstall",
]


def enabled_in_environment(environ: dict[str, str] | None = None) -> bool:
    """Whether `CADENCE_AS_ACCELERATE` asks for the alias (1, true, yes or on; any case)."""
    environ = os.environ if environ is None else environ
    return environ.get(ENV_VAR, "").strip().lower() in _TRUE


def is_installed() -> bool:
    """Whether this interpreter resolves `accelerate` to Cadence now."""
    return any(isinstance(finder, AccelerateAliasFinder) for finder in sys.meta_path)


def install() -> None:
    """Put the alias's import finder and metadata finder first on `sys.meta_path` (idempotent)."""
    if is_installed():
        return
    # First, so that Cadence wins over an installed reference: the user opted in (see
    # docs/differences.md); the finder says so once, when `accelerate` is first imported.
    sys.meta_path.insert(0, AliasDistributionFinder())
    sys.meta_path.insert(0, AccelerateAliasFinder())


def uninstall() -> None:
    """Remove the finders and forget the `accelerate` modules they produced."""
    sys.meta_path[:] = [
        f
        for f in sys.meta_path
        if not isinstance(f, (AccelerateAliasFinder, AliasDistributionFinder))
    ]
    forget_aliased_modules()


def as_accelerate() -> None:
    """Turn the alias on in this interpreter and in the processes it starts (sets the variable).

    Call it before importing transformers, TRL, peft or diffusers: they decide at import whether
    `accelerate` is installed.

    Example:
        >>> import cadence
        >>> cadence.as_accelerate()
        >>> import accelerate.state, cadence.state
        >>> accelerate.state.PartialState is cadence.state.PartialState
        True
    """
    os.environ[ENV_VAR] = "1"
    install()
    late = sorted(
        name for name in ("transformers", "trl", "peft", "diffusers") if name in sys.modules
    )
    if late:
        warnings.warn(
            f"cadence.as_accelerate() was called after {', '.join(late)} had been imported: they may "
            "already have decided that accelerate is not installed. Call it first (restart the kernel), "
            f"or set {ENV_VAR}=1 before starting Python.",
            stacklevel=2,
        )
