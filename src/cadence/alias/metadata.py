"""The metadata side of the alias: `importlib.metadata` finds an `accelerate` distribution of the
version Cadence matches, while the alias is on, and only for lookups over `sys.path` (pip reads
site-packages folders by path, so it never sees one)."""

from __future__ import annotations

import importlib.metadata
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from cadence.alias.finder import REFERENCE_NAME, REFERENCE_VERSION

_METADATA = (
    "Metadata-Version: 2.1\n"
    f"Name: {REFERENCE_NAME}\n"
    f"Version: {REFERENCE_VERSION}\n"
    "Summary: Cadence, imported as accelerate (CADENCE_AS_ACCELERATE is on)\n"
    "Requires-Python: >=3.10\n"
)


class AliasDistribution(importlib.metadata.Distribution):
    """An `accelerate` distribution with no files of its own: its modules are Cadence's."""

    def read_text(self, filename: str) -> str | None:
        """The METADATA and top_level.txt of the alias; None for any other file (no RECORD)."""
        if filename in ("METADATA", "PKG-INFO"):
            return _METADATA
        if filename == "top_level.txt":
            return f"{REFERENCE_NAME}\n"
        return None

    def locate_file(self, path: str | os.PathLike[str]) -> Path:
        """`path` under the folder that holds the `cadence` package."""
        return Path(__file__).resolve().parents[2] / path


def _normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "_", name).lower()


class AliasDistributionFinder(importlib.metadata.DistributionFinder):
    """Answers `importlib.metadata` for `accelerate` while the alias is installed."""

    def find_spec(self, *args: Any, **kwargs: Any) -> None:
        """Finds no module: the import side is `AccelerateAliasFinder`."""
        return None

    def find_distributions(
        self, context: importlib.metadata.DistributionFinder.Context | None = None
    ) -> Iterator[importlib.metadata.Distribution]:
        """The alias distribution for a lookup by name `accelerate` (or a listing) over sys.path."""
        context = context or importlib.metadata.DistributionFinder.Context()
        if "path" in vars(context):
            return iter(())  # a listing of given folders (pip's view): only what is really there
        if context.name is not None and _normalized(context.name) != REFERENCE_NAME:
            return iter(())
        return iter((AliasDistribution(),))
