"""Errors raised by Cadence's cross-rank checks."""

from __future__ import annotations


class DistributedOperationException(RuntimeError):
    """Ranks called a collective with incompatible inputs (raised on every rank)."""
