"""Accelerate's `commands.test` path: `cadence test` (home: `cadence.commands.test_cmd`)."""

from __future__ import annotations

import argparse
from typing import Any

from .parser_compat import command_parser, run_parser
from .test_cmd import register
from .test_cmd import run as _run


def test_command_parser(subparsers: Any = None) -> argparse.ArgumentParser:
    """The `test` parser: added to `subparsers` when given, standalone otherwise.

    Args:
        subparsers (Any): The subparsers action of the `cadence` parser; None builds a standalone parser.

    Returns:
        argparse.ArgumentParser: The parser.
    """
    return command_parser(register, "test", subparsers)


def test_command(args: argparse.Namespace) -> int:
    """Launch the bundled end-to-end check with `args.config_file`; returns its exit code.

    Args:
        args (argparse.Namespace): The parsed `test` arguments.

    Returns:
        int: The exit code.
    """
    return _run(args)


def main() -> int:
    """Run `cadence test` with the process arguments."""
    return run_parser(test_command_parser())


# Not a pytest test module: keep collectors from taking these for tests.
__test__ = False
