"""`cadence <command> [<args>]`: the command-line entry point.

Each command is a module of this package with a `register(subparsers)` function that adds its parser
and sets `func` (called with the parsed namespace; commands that also take the unrecognised arguments
set `accepts_unknown=True` and get them as a second argument). Modules must not import torch at import time: `cadence --help` stays fast.
"""

from __future__ import annotations

import argparse
import importlib
import sys

# Add a module name here to add a command (e.g. "test", "merge").
COMMAND_MODULES = (
    "config_cmd", "env", "estimate", "launch", "lighthouse", "merge_weights", "test_cmd", "to_fsdp2",
    "tpu",
)  # fmt: skip


def build_parser() -> argparse.ArgumentParser:
    """The `cadence` argument parser, with every subcommand registered."""
    parser = argparse.ArgumentParser(
        "cadence",
        usage="cadence <command> [<args>]",
        description="Run one PyTorch training script on a CPU, a GPU, many processes or many machines.",
        allow_abbrev=False,
    )
    subparsers = parser.add_subparsers(
        title="commands", dest="command", metavar="<command>", prog="cadence"
    )
    for name in COMMAND_MODULES:
        importlib.import_module(f"{__package__}.{name}").register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of `cadence`: parse `argv`, run the subcommand, return its exit code.

    Args:
        argv (list[str] | None): The arguments after `cadence`; None reads `sys.argv`.

    Returns:
        int: The exit code.
    """
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    func = getattr(args, "func", None)
    if func is None:
        parser.print_help()
        return 1
    takes_unknown = bool(getattr(args, "accepts_unknown", False))
    if unknown and not takes_unknown:
        parser.error(f"unrecognized arguments for `cadence {args.command}`: {' '.join(unknown)}")
    result = func(args, unknown) if takes_unknown else func(args)
    return int(result or 0)


if __name__ == "__main__":
    sys.exit(main())
