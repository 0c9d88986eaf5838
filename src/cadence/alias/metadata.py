"""The metadata side of the alias: `importlib.metadata` finds an `accelerate` distribution of the
version Cadence matches, while the alias is on, and only for lookups over `sys.path` (pip reads
site-packages folders by path, so it never sees one)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

from cadence.alias.finder import REFERENCE_NAME, REFERENCE_VERSION

_METADATA = (
    "Metadata-Version: 2.1\n"
    f"Name: {REFERENCE_NAME}\n"
    f"Version: {REFERENCE_VERSION}\n"
    "Summary: Cadence, imported as accelerate (CADENCE_AS_ACCELERATE is on)\n"
    "Requires-Python: >=3.10\n"
)


def _distribution_class() -> type:
    """`AliasDistribution`, built on first use: importing `importlib.metadata` costs start-up time,
    and whoever asks for metadata has imported it already."""
    global _DISTRIBUTION
    if _DISTRIBUTION is None:
        import importlib.metadata

        class AliasDistribution(importlib.metadata.Distribution):
            """An `accelerate` distribution with no files of its own: its modules are Cadence's."""

            def read_text(self, filename: str) -> str | None:
                """The METADATA and top_level.txt of the alias; None for any other file."""
                if filename in ("METADATA", "PKG-INFO"):
                    return _METADATA
                if filename == "top_level.txt":
                    return f"{REFERENCE_NAME}\n"
                return None

            def locate_file(self, path: str | os.PathLike[str]) -> Any:
                """`path` under the folder that holds the `cadence` package."""
                from pathlib import Path

                return Path(__file__).resolve().parents[2] / path

        _DISTRIBUTION = AliasDistribution
    return _DISTRIBUTION


_DISTRIBUTION: type | None = None


def _normalized(name: str) -> str:
    return name.lower().replace("-", "_").replace(".", "_")


class AliasDistributionFinder:
    """Answers `importlib.metadata` for `accelerate` while the alias is installed (a meta-path entry
    with `find_distributions`, which is all `importlib.metadata` asks of one)."""

    def find_spec(self, *args: Any, **kwargs: Any) -> None:
        """Finds no module: the import side is `AccelerateAliasFinder`."""
        return None

    def find_distributions(self, context: Any = None) -> Iterator[Any]:
        """The alias distribution for a lookup by name `accelerate` (or a listing) over sys.path."""
        if context is not None and "path" in vars(context):
            return iter(())  # a listing of given folders (pip's view): only what is really there
        name = getattr(context, "name", None)
        if name is not None and _normalized(name) != REFERENCE_NAME:
            return iter(())
        return iter((_distribution_class()(),))
