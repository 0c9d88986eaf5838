"""Shared helper of the bundled scripts: a check that fails loudly with the process index."""

from __future__ import annotations

import os


def check(condition: bool, what: str) -> None:
    """Raise AssertionError naming `what` (and this process's rank) unless `condition` holds."""
    if not condition:
        raise AssertionError(f"[rank {os.environ.get('RANK', '0')}] check failed: {what}")
