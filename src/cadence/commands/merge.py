"""Accelerate's `commands.merge` path: `cadence merge-weights` (home: `cadence.commands.merge_weights`)."""

from __future__ import annotations

import argparse
from typing import Any

from .merge_weights import DESCRIPTION as description
from .merge_weights import merge_command, register
from .parser_compat import command_parser, run_parser


def merge_command_parser(subparsers: Any = None) -> argparse.ArgumentParser:
    """The `merge-weights` parser: added to `subparsers` when given, standalone otherwise.

    Args:
        subparsers (Any): The subparsers action of the `cadence` parser; None builds a standalone parser.

    Returns:
        argparse.ArgumentParser: The parser.
    """
    return command_parser(register, "merge-weights", subparsers)


def main() -> int:
    """Run `cadence merge-weights` with the process arguments."""
    return run_parser(merge_command_parser())


__all__ = ["description", "main", "merge_command", "merge_command_parser"]
