"""Adapters between Cadence's command modules (`register(subparsers)`) and Accelerate's
`<command>_command_parser(subparsers=None)` / `main()` entry points."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Any


def command_parser(
    register: Callable[[Any], None], name: str, subparsers: Any = None
) -> argparse.ArgumentParser:
    """The parser of command `name`: added to `subparsers` when given, standalone otherwise."""
    if subparsers is None:
        root = argparse.ArgumentParser("cadence", allow_abbrev=False)
        subparsers = root.add_subparsers(dest="command", prog="cadence")
    register(subparsers)
    return subparsers.choices[name]


def run_parser(parser: argparse.ArgumentParser, argv: list[str] | None = None) -> int:
    """Parse `argv` (default: the process arguments) with `parser` and run the chosen `func`."""
    args, unknown = parser.parse_known_args(sys.argv[1:] if argv is None else argv)
    func = getattr(args, "func", None)
    if func is None:
        parser.print_help()
        return 1
    if getattr(args, "accepts_unknown", False):
        return int(func(args, unknown) or 0)
    if unknown:
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    return int(func(args) or 0)
