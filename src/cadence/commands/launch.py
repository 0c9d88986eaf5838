"""`cadence launch`: parse the flags, resolve the plan, print it, then start it (or only print it)."""

from __future__ import annotations

import argparse
import copy
import difflib
import os
import sys
from pathlib import Path
from typing import Any

from ..launch.args import UNSUPPORTED_FLAG_PREFIXES, build_launch_parser

_known_options: list[str] = []
# Option string -> whether it takes a value (so a valid flag's value is never taken for a flag).
_takes_value: dict[str, bool] = {}


def register(subparsers: Any) -> None:
    """Add the `launch` subcommand to `subparsers`."""

    def make_parser(**options: Any) -> argparse.ArgumentParser:
        return subparsers.add_parser(
            "launch", help="Launch a script on one or many processes and machines.", **options
        )

    parser, options = build_launch_parser(make_parser)
    _known_options[:] = options
    _takes_value.clear()
    for action in parser._actions:
        for option in action.option_strings:
            _takes_value[option] = action.nargs != 0
    parser.set_defaults(func=_cli_launch_command, accepts_unknown=True)


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
        # Compare the names without their dashes: "--" alone would make any two flags look alike.
        names = {option.lstrip("-").replace("-", "_"): option for option in known}
        names = {name: option for name, option in names.items() if option.startswith("--")}
        guess = difflib.get_close_matches(normalised[2:], list(names), n=1, cutoff=0.6)
        hint = f" (did you mean --{guess[0]}?)" if guess else " (see `cadence launch --help`)"
        lines.append(f"{flag}: unknown flag{hint}")
    return (
        "cadence launch cannot start:\n  - "
        + "\n  - ".join(lines)
        + "\nFlags for cadence go before the script; flags after the script are passed to it. Nothing was started."
    )


def _flags_before_script(args: argparse.Namespace) -> list[str]:
    """Unknown flags argparse took as the script or its arguments because an unknown flag swallowed
    a value (`--bogus 3 --num_processes 1 s.py`: "3" became the script). Valid flags there, and
    their values, are skipped: only the unknown ones are reported."""
    if getattr(args, "module", False):
        return []
    tokens = [args.training_script, *(args.training_script_args or [])]
    found: list[str] = []
    index = 0
    while index < len(tokens):  # bounded: every pass moves on by one or two tokens
        token = tokens[index]
        index += 1
        if Path(token).is_file():
            break
        if not token.startswith("-"):
            continue
        flag, has_inline_value = token.split("=", 1)[0], "=" in token
        if flag in _takes_value:
            if _takes_value[flag] and not has_inline_value:
                index += 1  # its value
            continue
        found.append(token)
    return found


def _cli_launch_command(args: argparse.Namespace, unknown: list[str] | None = None) -> int:
    """`cadence launch` on the command line: an invalid launch is reported, exit code 2."""
    from ..launch.settings import (  # deferred: loaded when the command runs (keeps `cadence --help` fast)
        LaunchPlanError,
    )

    try:
        return launch_command(args, unknown)
    except LaunchPlanError as err:
        print(str(err), file=sys.stderr)
        return 2


def launch_command(args: argparse.Namespace, unknown: list[str] | None = None) -> int:
    """Run `cadence launch` for `args` (the processes, or a dry run) and return the exit code.

    An invalid launch (bad flags, config file or environment) raises `LaunchPlanError`, a
    `ValueError` listing every problem, before anything starts, as Accelerate's `launch_command`
    raises `ValueError`; the command line prints it and exits with code 2.

    Args:
        args (argparse.Namespace): The parsed `launch` arguments.
        unknown (list[str] | None): Arguments the parser did not know (passed on to the script).

    Returns:
        int: The exit code.
    """
    from ..launch.banner import (  # deferred: loaded when the command runs (keeps `cadence --help` fast)
        format_banner,
        format_dry_run,
    )
    from ..launch.plan import (  # deferred: loaded when the command runs (keeps `cadence --help` fast)
        build_plan,
    )

    if unknown:
        unknown = unknown + _flags_before_script(args)
        print(unknown_flags_message(unknown, _known_options), file=sys.stderr)
        return 2
    dry_run = bool(getattr(args, "dry_run", False))
    if getattr(args, "as_accelerate", False):
        # The workers inherit the launcher's environment; the alias installs itself in each.
        os.environ["CADENCE_AS_ACCELERATE"] = "1"
    for name in ("func", "accepts_unknown", "dry_run", "command", "as_accelerate"):
        if name in vars(args):
            delattr(args, name)
    from ..launch.xla_launcher import (  # deferred: loaded when the command runs (keeps `cadence --help` fast)
        wants_xla,
        xla_launch,
    )

    if wants_xla(args):  # --tpu, or a config file's distributed_type XLA: torch_xla's launcher
        return xla_launch(args, dry_run)
    from ..launch.fault_tolerance_flags import (  # deferred: loaded when the command runs (keeps `cadence --help` fast)
        wants_fault_tolerance_flags,
    )

    if wants_fault_tolerance_flags(args):  # torchft's Lighthouse and replica groups
        from ..launch.fault_tolerance import (  # deferred: imports torch (the plugin's record)
            fault_tolerant_launch,
        )

        return fault_tolerant_launch(args, dry_run)
    plan = build_plan(args)
    if dry_run:
        print(format_dry_run(plan))
        return 0
    if not plan.value("quiet"):
        print(format_banner(plan), file=sys.stderr, flush=True)
    from ..launch.runner import (
        run_plan,  # deferred: loaded when the command runs (keeps `cadence --help` fast)
    )

    try:
        return run_plan(plan)
    except KeyboardInterrupt:  # Ctrl-C before torch elastic took over the signals
        print("cadence launch: interrupted", file=sys.stderr)
        return 130


def _validate_launch_command(
    args: argparse.Namespace,
) -> tuple[argparse.Namespace, Any, bool]:
    """Merge the flags, the environment and the config file into `args`, as `cadence launch` does.

    Accelerate's private step, kept for scripts that call it: every launch setting is resolved by
    the launch plan (flags over environment over config file over defaults) and written back onto
    `args`. Returns `(args, config, mixed_precision_from_config)`, `config` being the loaded config
    file or None. Raises `LaunchPlanError` (listing every problem) when the launch is invalid.
    """
    from ..launch.config_file import (  # deferred: loaded when the command runs (keeps `cadence --help` fast)
        load_config_from_file,
    )
    from ..launch.plan import (  # deferred: loaded when the command runs (keeps `cadence --help` fast)
        build_plan,
    )
    from ..launch.settings import (  # deferred: loaded when the command runs (keeps `cadence --help` fast)
        CONFIG,
    )

    plan = build_plan(args)
    for name, setting in plan.settings.items():
        setattr(args, name, setting.value)
    config = load_config_from_file(plan.config_file) if plan.config_file else None
    from_config = plan.settings["mixed_precision"].source == CONFIG
    return args, config, from_config


# -- the reference's module-level names ------------------------------------------------------
# Option -> help-section title, used by the reference's help formatter to show only the sections
# of the platforms named on the command line.
options_to_group = {
    "multi_gpu": "Distributed GPUs",
    "tpu": "TPU",
    "use_deepspeed": "DeepSpeed Arguments",
    "use_fsdp": "FSDP Arguments",
    "use_megatron_lm": "Megatron-LM Arguments",
    "fp8_backend": "FP8 Arguments",
}


def clean_option(option: str) -> str | None:
    """`--some-flag` -> `some_flag` (any `--fp8_backend...` -> `fp8_backend`); None for a non-flag.

    Example:
        >>> clean_option("--num-processes")
        'num_processes'

    Args:
        option (str): A command-line word.

    Returns:
        str | None: The option's name, or None.
    """
    if "fp8_backend" in option:
        option = "--fp8_backend"
    if option.startswith("--"):
        return option[2:].replace("-", "_")
    return None


class CustomHelpFormatter(argparse.HelpFormatter):
    """A help formatter that lists each option once, in its underscore spelling (`--num_processes`
    rather than also `--num-processes`), and drops empty sections.

    Args:
        *args: As for `argparse.HelpFormatter` (prog first).
        **kwargs: As for `argparse.HelpFormatter` (indent_increment, max_help_position, width).
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)

    def add_argument(self, action: argparse.Action) -> None:
        """List only one spelling of each option in the help.

        Args:
            action (argparse.Action): The argument to list.
        """
        spellings = [s for s in action.option_strings if "-" not in s[2:]]
        if spellings and spellings != action.option_strings:
            action = copy.copy(action)  # the parser keeps both spellings; only the help lists one
            action.option_strings = spellings
        super().add_argument(action)


def launch_command_parser(subparsers: Any = None) -> argparse.ArgumentParser:
    """The `launch` parser: added to `subparsers` when given, standalone otherwise.

    Example:
        >>> args = launch_command_parser().parse_args(["--num_processes", "2", "train.py"])

    Args:
        subparsers (Any): The subparsers action of the `cadence` parser; None builds a standalone parser.

    Returns:
        argparse.ArgumentParser: The parser.
    """
    from .parser_compat import (
        command_parser,  # deferred: loaded when the command runs (keeps `cadence --help` fast)
    )

    parser = command_parser(register, "launch", subparsers)
    if subparsers is None:
        # Standalone, its namespace answers for every flag (as the reference's parser does); the
        # typed flags alone are in vars(args), which is what the launch plan reads.
        defaults = {
            action.dest: _RAW_DEFAULTS.get(
                action.dest, False if action.nargs == 0 and action.const is True else None
            )
            for action in parser._actions
            if action.dest not in ("help", argparse.SUPPRESS)
        }
        namespace_type = type("LaunchNamespace", (LaunchNamespace,), {"_defaults": defaults})
        parse_known_args = parser.parse_known_args

        def parse_with_defaults(args: Any = None, namespace: Any = None) -> Any:
            return parse_known_args(args, namespace_type() if namespace is None else namespace)

        parser.parse_known_args = parse_with_defaults  # type: ignore[method-assign]
    return parser


# Untyped flags whose raw value in Accelerate's parser is not None: scripts that read the parsed
# namespace before `_validate_launch_command` see the same value (the plan reads typed flags only).
_RAW_DEFAULTS = {"fsdp_sync_module_states": "true"}


class LaunchNamespace(argparse.Namespace):
    """Flags parsed by a standalone `launch_command_parser()`. A typed flag is an attribute; one
    that was not typed reads as its default (False for an on/off flag, None otherwise) without being
    stored, so the launch plan still tells typed values from defaults."""

    _defaults: dict[str, Any] = {}

    def __getattr__(self, name: str) -> Any:
        defaults = type(self)._defaults
        if name in defaults:
            return defaults[name]
        raise AttributeError(f"'LaunchNamespace' object has no attribute '{name}'")


def _run_namespace(args: argparse.Namespace) -> None:
    """Start the job `args` describes and wait; a failure raises CalledProcessError."""
    import subprocess

    code = launch_command(args)
    if code:
        raise subprocess.CalledProcessError(
            returncode=code, cmd=["cadence", "launch", str(args.training_script)]
        )


def simple_launcher(args: argparse.Namespace) -> None:
    """Run the script of `args` (one process, or what `args` asks for) and wait for it.

    Args:
        args (argparse.Namespace): The parsed `launch` arguments.
    """
    _run_namespace(args)


def multi_gpu_launcher(args: argparse.Namespace) -> None:
    """Run the script of `args` on several processes through the elastic agent and wait.

    Args:
        args (argparse.Namespace): The parsed `launch` arguments.
    """
    _run_namespace(args)


def deepspeed_launcher(args: argparse.Namespace) -> None:
    """Run the script of `args` with DeepSpeed settings and wait.

    Args:
        args (argparse.Namespace): The parsed `launch` arguments.
    """
    _run_namespace(args)


def tpu_launcher(args: argparse.Namespace) -> None:
    """Run the script's main function on this host's XLA devices through torch_xla, and wait.

    Args:
        args (argparse.Namespace): The parsed `launch` arguments.

    Raises:
        subprocess.CalledProcessError: The script failed.
    """
    from ..launch.xla_launcher import (
        xla_launch,  # deferred: loaded when the command runs (keeps `cadence --help` fast)
    )

    code = xla_launch(args)
    if code:
        import subprocess

        raise subprocess.CalledProcessError(
            returncode=code, cmd=["cadence", "launch", "--tpu", str(args.training_script)]
        )


def tpu_pod_launcher(args: argparse.Namespace) -> None:
    """Launch on a TPU pod (unsupported: run `cadence launch --tpu` on every host of the pod).

    Args:
        args (argparse.Namespace): The parsed `launch` arguments.
    """
    from ..unsupported.torch_xla import (
        tpu_pod_launcher as unsupported_tpu_pod_launcher,  # deferred: loaded when the command runs (keeps `cadence --help` fast)
    )

    unsupported_tpu_pod_launcher(args)


def sagemaker_launcher(sagemaker_config: Any, args: argparse.Namespace) -> None:
    """Start a SageMaker job (unsupported).

    Args:
        sagemaker_config (Any): The SageMaker config file's settings.
        args (argparse.Namespace): The parsed `launch` arguments.
    """
    from ..unsupported.sagemaker import (
        sagemaker_launcher as unsupported_sagemaker_launcher,  # deferred: loaded when the command runs (keeps `cadence --help` fast)
    )

    unsupported_sagemaker_launcher(sagemaker_config, args)


def main() -> int:
    """`cadence-launch`-style entry point: parse the process arguments as `cadence launch` does."""
    from .parser_compat import (
        run_parser,  # deferred: loaded when the command runs (keeps `cadence --help` fast)
    )

    return run_parser(launch_command_parser())
