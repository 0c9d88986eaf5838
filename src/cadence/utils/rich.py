"""Accelerate's `utils.rich` path: importing it installs rich's traceback handler."""

from __future__ import annotations

from ..core.availability import _is_package_available

if not _is_package_available("rich"):
    raise ModuleNotFoundError("To use the rich extension, install rich with `pip install rich`")

from rich.traceback import install  # optional dependency  # noqa: E402

install(show_locals=False)

__all__: list[str] = []
