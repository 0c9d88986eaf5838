"""`cadence launch`: parse the flags, resolve the plan, print it, then start it (or only print it)."""

from __future__ import annotations

import argparse
import difflib
import sys
from pathlib import Path
from typing import Any

from .launch_args import UNSUPPORTED_FLAG_PREFIXES, build_launch_parser

_known_options: list[str] = []


def register(subparsers: Any) -> None:
    def make_parser(**options: Any) -> argparse.ArgumentParser:
        return subparsers.add_parser(
            "launch", help="Launch a script on one or many processes and machines.", **options
        )

    parser, options = build_launch_parser(make_parser)
    _known_options[:] = options
    parser.set_defaults(func=launch_command, accepts_unknown=True)


def unknown_flags_message(unknown: list[str], known: list[str]) -> str:
    """Say, for each flag the launcher does not take, why, or what was probably meant."""
    lines = []
    for token in unknown:
        flag = token.split("=", 1)[0]
        normalised = "--" + flag.lstrip("-").replace("-", "_")
        reason = next(
            (
                why
                for name, why in UNSUPPORTED_FLAG_PREFIXES.items()
                if normalised == name or (name.endswith("_") and normalised.startswith(name))
            ),
            None,
        )
        if reason:
            lines.append(f"{flag}: {reason}")
            continue
        guess = difflib.get_close_matches(flag, known, n=1, cutoff=0.6)
        lines.append(f"{flag}: unknown flag" + (f" (did you mean {guess[0]}?)" if guess else ""))
    return (
        "cadence launch cannot start:\n  - "
        + "\n  - ".join(lines)
        + "\nFlags for cadence go before the script; flags after the script are passed to it. Nothing was started."
    )


def _flags_before_script(args: argparse.Namespace) -> list[str]:
    """Flags argparse took as the script or its arguments because an unknown flag swallowed a value."""
    if getattr(args, "module", False):
        return []
    found = []
    for token in [args.training_script, *(args.training_script_args or [])]:
        if Path(token).is_file():
            break
        if token.startswith("-"):
            found.append(token)
    return found


def launch_command(args: argparse.Namespace, unknown: list[str] | None = None) -> int:
    from .launch_banner import (  # deferred: loaded when the command runs (keeps `cadence --help` fast)
        format_banner,
        format_dry_run,
    )
    from .launch_plan import (  # deferred: loaded when the command runs (keeps `cadence --help` fast)
        LaunchPlanError,
        build_plan,
    )

    if unknown:
        unknown = unknown + _flags_before_script(args)
        print(unknown_flags_message(unknown, _known_options), file=sys.stderr)
        return 2
    dry_run = bool(getattr(args, "dry_run", False))
    for name in ("func", "accepts_unknown", "dry_run", "command"):
        if hasattr(args, name):
            delattr(args, name)
    try:
        plan = build_plan(args)
    except LaunchPlanError as err:
        print(str(err), file=sys.stderr)
        return 2
    if dry_run:
        print(format_dry_run(plan))
        return 0
    if not plan.value("quiet"):
        print(format_banner(plan), file=sys.stderr, flush=True)
    from .launch_runner import (
        run_plan,  # deferred: loaded when the command runs (keeps `cadence --help` fast)
    )

    try:
        return run_plan(plan)
    except KeyboardInterrupt:  # Ctrl-C before torch elastic took over the signals
        print("cadence launch: interrupted", file=sys.stderr)
        return 130
