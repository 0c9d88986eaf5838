"""`cadence test`: launch the bundled end-to-end check on the configured processes."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

SUCCESS = "Test is a success! You are ready for your distributed training!"


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the `test` subcommand to `subparsers`."""
    parser = subparsers.add_parser(
        "test",
        help="Check that this machine's set-up trains correctly.",
        description="Runs collectives, a few training steps and a checkpoint round-trip on the configured processes.",
    )
    parser.add_argument(
        "--config_file", "--config-file", default=None, help="the config file to launch with"
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Run the self-test through `cadence launch` and return its exit code."""
    import cadence.selftest.end_to_end as script  # deferred: imports torch; only its path is needed

    command = [sys.executable, "-m", "cadence.commands.cli", "launch"]
    if args.config_file is not None:
        if not os.path.isfile(args.config_file):
            print(f"cadence test: config file {args.config_file} does not exist.", file=sys.stderr)
            return 2
        command.append(f"--config_file={args.config_file}")
    command.append(script.__file__)
    result = subprocess.run(command)
    if result.returncode == 0:
        print(SUCCESS)
    else:
        print(
            f"cadence test: the check failed (exit code {result.returncode}); see the output above.",
            file=sys.stderr,
        )
    return result.returncode
