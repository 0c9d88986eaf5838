"""`cadence config` (questions), `cadence config default` (no questions), `cadence config update`."""

from __future__ import annotations

import argparse
import sys
from typing import Any

_LOCATION_HELP = (
    "Where the config file goes (default: $HF_HOME/cadence/default_config.yaml, else "
    "$XDG_CACHE_HOME/huggingface/cadence/..., else ~/.cache/huggingface/cadence/...). "
    "A name ending in .json writes JSON."
)


def register(subparsers: Any) -> None:
    """Add the `config` command and its `default` and `update` subcommands to the CLI parser."""
    parser = subparsers.add_parser(
        "config",
        help="Answer a few questions and save a config file for `cadence launch`.",
        description="Asks how this machine should train and writes a config file for `cadence launch`.",
        allow_abbrev=False,
    )
    parser.add_argument("--config_file", "--config-file", default=None, help=_LOCATION_HELP)
    parser.set_defaults(func=config_command)
    commands = parser.add_subparsers(title="subcommands", dest="subcommand", metavar="<subcommand>")

    default = commands.add_parser(
        "default",
        help="Write a config for this machine without asking anything.",
        description="Writes a config for this machine (all its GPUs, or one CPU process) without questions.",
        allow_abbrev=False,
    )
    default.add_argument(
        "--config_file", "--config-file", default=argparse.SUPPRESS, help=_LOCATION_HELP
    )
    default.add_argument(
        "--mixed_precision",
        "--mixed-precision",
        choices=["no", "fp16", "bf16"],
        type=str.lower,
        default="no",
        help="Mixed precision to record in the file (default: no).",
    )
    default.set_defaults(func=default_command)

    update = commands.add_parser(
        "update",
        help="Upgrade a config file written by an older version to the current format.",
        description="Rewrites a config file in the current format, keeping its settings.",
        allow_abbrev=False,
    )
    update.add_argument(
        "--config_file", "--config-file", default=argparse.SUPPRESS, help=_LOCATION_HELP
    )
    update.set_defaults(func=update_command)


def _fail(message: str) -> int:
    print(message, file=sys.stderr)
    return 1


def config_command(args: argparse.Namespace) -> int:
    """`cadence config`: ask the questions and save the answers; returns the exit code.

    Args:
        args (argparse.Namespace): The parsed `config` arguments.

    Returns:
        int: The exit code.
    """
    from ..launch.config_file import (
        default_config_path,  # deferred: loaded when the command runs (keeps `cadence --help` fast)
    )
    from .config_questions import (  # deferred: loaded when the command runs (keeps `cadence --help` fast)
        ConfigAborted,
        ask_config,
        make_prompter,
    )

    target = args.config_file or str(default_config_path())
    try:
        config = ask_config(make_prompter())
    except ConfigAborted as stop:
        return _fail(f"cadence config: {stop} Nothing was written.")
    path = config.save(target)
    print(f"cadence configuration saved at {path}")
    return 0


def default_command(args: argparse.Namespace) -> int:
    """`cadence config default`: write a config for this machine without questions; exit code."""
    from ..launch.config_file import (  # deferred: loaded when the command runs (keeps `cadence --help` fast)
        ConfigFileError,
        write_basic_config,
    )

    try:
        path = write_basic_config(args.mixed_precision, args.config_file)
    except (ConfigFileError, OSError) as err:
        return _fail(f"cadence config default: {err}")
    if not path:
        return 0  # an existing file is left alone, and that is not an error (as in the reference)
    print(f"cadence configuration saved at {path}")
    return 0


def update_command(args: argparse.Namespace) -> int:
    """`cadence config update`: rewrite an old config file in the current format; exit code."""
    from ..launch.config_file import (  # deferred: loaded when the command runs (keeps `cadence --help` fast)
        ConfigFileError,
        update_config_file,
    )

    try:
        path, notes = update_config_file(args.config_file)
    except ConfigFileError as err:
        return _fail(str(err))
    print(f"Successfully updated the configuration file at {path}.")
    for note in notes:
        print(f"  - {note}")
    return 0
