"""Accelerate's `commands.config` path: the `config` command's parsers, `default_config_file`
and `load_config_from_file` (homes: `cadence.commands.config_cmd`, `cadence.launch.config_file`)."""

from __future__ import annotations

import argparse
from typing import Any

from .config import config_command_parser
from .config_args import load_config_from_file
from .default import default_command_parser
from .update import update_command_parser


def __getattr__(name: str) -> Any:
    # Resolved when read, so a later HF_HOME change is followed (the reference fixes it at import).
    if name == "default_config_file":
        from ...launch.config_file import (
            default_config_path,  # deferred: loaded when the command runs (keeps `cadence --help` fast)
        )

        return str(default_config_path())
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def get_config_parser(subparsers: Any = None) -> argparse.ArgumentParser:
    """The `config` parser with its `default` and `update` subcommands.

    Args:
        subparsers (Any): The subparsers action of the `cadence` parser; None builds a standalone parser.

    Returns:
        argparse.ArgumentParser: The parser.
    """
    return config_command_parser(subparsers)


def main() -> int:
    """Run `cadence config` with the process arguments."""
    from ..parser_compat import (
        run_parser,  # deferred: loaded when the command runs (keeps `cadence --help` fast)
    )

    return run_parser(get_config_parser())


__all__ = [
    "config_command_parser",
    "default_command_parser",
    "default_config_file",
    "get_config_parser",
    "load_config_from_file",
    "main",
    "update_command_parser",
]
