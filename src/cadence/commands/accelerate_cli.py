"""Accelerate's `commands.accelerate_cli` path: the `cadence` command's entry point."""

from __future__ import annotations

from .cli import main

__all__ = ["main"]
