"""Accelerate's `commands.config.config` path: the interactive `config` command."""

from __future__ import annotations

import argparse
from typing import Any

from ..config_cmd import config_command
from ..config_cmd import register as _register

description = (
    "Asks a series of questions and saves a `default_config.yaml` configuration file for your training "
    "system. Run it first on each machine."
)


def config_command_parser(subparsers: Any = None) -> argparse.ArgumentParser:
    """The `config` parser (with `default` and `update`): added to `subparsers`, or standalone.

    Args:
        subparsers (Any): The subparsers action of the `cadence` parser; None builds a standalone parser.

    Returns:
        argparse.ArgumentParser: The parser.
    """
    from ..parser_compat import (
        command_parser,  # deferred: loaded when the command runs (keeps `cadence --help` fast)
    )

    return command_parser(_register, "config", subparsers)


def get_user_input() -> Any:
    """Ask the configuration questions in the terminal and return the resulting config object."""
    from .cluster import (
        get_cluster_input,  # deferred: loaded when the command runs (keeps `cadence --help` fast)
    )

    return get_cluster_input()


def main() -> int:
    """Run `cadence config` with the process arguments."""
    from ..parser_compat import (
        run_parser,  # deferred: loaded when the command runs (keeps `cadence --help` fast)
    )

    return run_parser(config_command_parser())


__all__ = ["config_command", "config_command_parser", "description", "get_user_input", "main"]
