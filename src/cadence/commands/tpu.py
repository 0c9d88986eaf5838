"""`cadence tpu-config`: run setup commands on every worker of a TPU VM pod through `gcloud`.

Accelerate's `commands.tpu` path. The command line is built from the flags and the config file
(`tpu_name`, `tpu_zone`, `commands`, `command_file`), then handed to `gcloud compute tpus tpu-vm ssh
... --worker all`; with `--debug` it is only printed. Cadence runs no transport of its own: `gcloud`
must be installed (the Google Cloud SDK).
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from ..launch.config_file import default_config_path, load_config_from_file

__all__ = ["main", "register", "tpu_command_launcher", "tpu_command_parser"]

# Every command runs from here on the workers, as with the reference (a folder every image has).
WORKING_DIRECTORY = "cd /usr/share"


def tpu_command_parser(subparsers: Any = None) -> argparse.ArgumentParser:
    """The `tpu-config` parser; added to `subparsers` when given, else standalone.

    Example:

    >>> args = tpu_command_parser().parse_args(["--tpu_name", "pod", "--tpu_zone", "z", "--command", "ls", "--debug"])
    >>> args.command
    [['ls']]

    Args:
        subparsers (Any): The subparsers action of the `cadence` parser; None builds a standalone parser.

    Returns:
        argparse.ArgumentParser: The parser.
    """
    description = "Run commands on every worker of a TPU VM pod (through `gcloud`)."
    if subparsers is not None:
        parser = subparsers.add_parser("tpu-config", help=description, description=description)
    else:
        parser = argparse.ArgumentParser("cadence tpu-config", description=description)
    config = parser.add_argument_group(
        "Config arguments", "Read from the config file when not given."
    )
    config.add_argument(
        "--config_file",
        "--config-file",
        default=None,
        help="The config file holding tpu_name, tpu_zone, commands or command_file "
        "(default: the default config file, when it exists).",
    )
    config.add_argument(
        "--tpu_name", default=None, help="The name of the TPU VM (pod) to configure."
    )
    config.add_argument("--tpu_zone", default=None, help="The zone of the TPU VM.")
    pod = parser.add_argument_group("TPU arguments", "What to run on the pod.")
    pod.add_argument(
        "--use_alpha", action="store_true", help="Use `gcloud alpha` instead of `gcloud`."
    )
    pod.add_argument(
        "--command",
        action="append",
        nargs="+",
        help="A command to run on every worker; repeat the flag for several, run in order.",
    )
    pod.add_argument(
        "--command_file",
        default=None,
        help="A file with one command per line to run on every worker.",
    )
    # Accelerate's flag names, and the same under Cadence's name (a command switched by renaming).
    pod.add_argument(
        "--install_accelerate",
        "--install_cadence",
        dest="install_accelerate",
        action="store_true",
        help="Install Cadence on every worker first (`pip install cadence`).",
    )
    pod.add_argument(
        "--accelerate_version",
        "--cadence_version",
        dest="accelerate_version",
        default="latest",
        help="The Cadence version --install_accelerate installs: 'latest' (default), 'dev' "
        "(from its repository) or a version number.",
    )
    pod.add_argument(
        "--debug", action="store_true", help="Print the gcloud command instead of running it."
    )
    if subparsers is not None:
        parser.set_defaults(func=tpu_command_launcher)
    return parser


def register(subparsers: Any) -> None:
    """Add the `tpu-config` command to the CLI parser."""
    tpu_command_parser(subparsers).set_defaults(func=_cli_tpu_config)


def _cli_tpu_config(args: argparse.Namespace) -> int:
    """`cadence tpu-config` on the command line: a bad invocation is reported, exit code 2."""
    try:
        return tpu_command_launcher(args)
    except (ValueError, FileNotFoundError) as error:
        print(f"cadence tpu-config: {error}", file=sys.stderr)
        return 2


def _flatten(commands: Any) -> list[str]:
    """`--command` given several times, each with one or more words, as one list of commands."""
    if commands is None:
        return []
    if isinstance(commands, str):
        return [commands]
    flat: list[str] = []
    for entry in commands:
        flat += [entry] if isinstance(entry, str) else [" ".join(str(word) for word in entry)]
    return flat


def _install_command(version: str) -> str:
    if version == "latest":
        return "pip install cadence -U"
    if version == "dev":
        raise ValueError(
            "--accelerate_version dev is not available for Cadence: pass 'latest' or a version "
            "number (e.g. 0.1.0)."
        )
    return f"pip install cadence=={version}"


def gcloud_command(args: argparse.Namespace) -> list[str]:
    """The `gcloud` command line `tpu-config` runs for `args`, with the config file's defaults.

    Raises ValueError (before anything runs) when no command, TPU name or zone is known.
    """
    config = None
    if args.config_file is not None or default_config_path().is_file():
        config = load_config_from_file(args.config_file)
    tpu_name = args.tpu_name or getattr(config, "tpu_name", None)
    tpu_zone = args.tpu_zone or getattr(config, "tpu_zone", None)
    commands = _flatten(args.command)
    command_file = args.command_file
    if not commands and command_file is None and config is not None:
        commands = _flatten(getattr(config, "commands", None))
        if not commands:
            command_file = getattr(config, "command_file", None)
    if not commands and command_file is not None:
        path = Path(command_file)
        if not path.is_file():
            raise ValueError(
                f"--command_file {command_file} does not exist: pass a file of commands."
            )
        commands = [line.strip() for line in path.read_text().splitlines() if line.strip()]
    problems = []
    if not commands:
        problems.append(
            "You must specify either a command file or a command to run on the pod "
            "(--command, --command_file, or commands / command_file in the config file)."
        )
    if not tpu_name:
        problems.append("No TPU name: pass --tpu_name or set tpu_name in the config file.")
    if not tpu_zone:
        problems.append("No TPU zone: pass --tpu_zone or set tpu_zone in the config file.")
    if problems:
        raise ValueError("\n".join(problems))
    steps = [WORKING_DIRECTORY]
    if args.install_accelerate:
        steps.append(_install_command(args.accelerate_version))
    steps += commands
    gcloud = ["gcloud", "alpha"] if args.use_alpha else ["gcloud"]
    return [
        *gcloud, "compute", "tpus", "tpu-vm", "ssh", tpu_name,
        "--zone", tpu_zone, "--command", "; ".join(steps), "--worker", "all",
    ]  # fmt: skip


def tpu_command_launcher(args: argparse.Namespace) -> int:
    """Run (or with `--debug` print) the gcloud command that configures every worker of the pod.

    Args:
        args (argparse.Namespace): The parsed `tpu-config` arguments.

    Returns:
        int: The exit code.

    Raises:
        FileNotFoundError: `gcloud` is not installed.
    """
    command = gcloud_command(args)
    if args.debug:
        print(f"Running {' '.join(command)}")
        return 0
    if shutil.which(command[0]) is None:
        raise FileNotFoundError(
            "`gcloud` is not installed or not on PATH: install the Google Cloud SDK "
            "(https://cloud.google.com/sdk/docs/install), or pass --debug to print the command."
        )
    result = subprocess.run(command)
    if result.returncode == 0:
        print("Successfully setup pod.")
    return result.returncode


def main() -> None:
    """`cadence tpu-config` as a program of its own."""
    sys.exit(_cli_tpu_config(tpu_command_parser().parse_args()))
