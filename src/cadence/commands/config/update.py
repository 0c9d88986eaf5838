"""Accelerate's `commands.config.update` path: `config update` (home: `cadence.launch.config_file`)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from ...launch.config_file import update_config_file
from ..config_cmd import update_command

description = "Update an existing config file with the latest defaults while keeping its settings."


def update_command_parser(
    parser: Any, parents: list[argparse.ArgumentParser]
) -> argparse.ArgumentParser:
    """Add the `update` subcommand to the subparsers `parser` (with `parents`' options).

    Args:
        parser (Any): The subparsers action of the `config` parser.
        parents (list[argparse.ArgumentParser]): Parsers whose options the subcommand also takes.

    Returns:
        argparse.ArgumentParser: The subcommand's parser.
    """
    update = parser.add_parser("update", parents=parents, help=description, description=description)
    update.add_argument(
        "--config_file", "--config-file", default=None, help="The config file to update."
    )
    update.set_defaults(func=update_config_command)
    return update


def update_config(args: argparse.Namespace) -> Path:
    """Rewrite `args.config_file` (default location if None) in the current format; returns its path.

    Args:
        args (argparse.Namespace): The parsed `config update` arguments.

    Returns:
        Path: The file rewritten.
    """
    path, _notes = update_config_file(args.config_file)
    return path


def update_config_command(args: argparse.Namespace) -> int:
    """`config update`: rewrite the file and say what changed.

    Args:
        args (argparse.Namespace): The parsed `config update` arguments.

    Returns:
        int: The exit code.
    """
    return update_command(args)


__all__ = ["description", "update_command_parser", "update_config", "update_config_command"]
