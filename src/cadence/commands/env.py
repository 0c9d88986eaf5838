"""`cadence env`: what a bug report needs (versions, platform, hardware, the config file)."""

from __future__ import annotations

import argparse
import platform
import shutil
import sys
from typing import Any

from ..launch.config_file import ConfigFileError, default_config_path, load_config_from_file
from ..runtime.hardware import usable_cpu_count, visible_gpu_count


def register(subparsers: Any) -> None:
    """Add the `env` command to the CLI parser."""
    parser = subparsers.add_parser(
        "env",
        help="Print versions, hardware and the config file, for bug reports.",
        description="Prints the Cadence, Python and PyTorch versions, the platform, CPU/GPU and the config file.",
        allow_abbrev=False,
    )
    parser.add_argument(
        "--config_file",
        "--config-file",
        default=None,
        help="The config file to show (default: the default one).",
    )
    parser.set_defaults(func=env_command)


def _version(distribution: str) -> str:
    from importlib import metadata

    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return "not installed"


def _memory_gib() -> str:
    try:
        with open("/proc/meminfo", encoding="ascii") as handle:
            for line in handle:
                if line.startswith("MemTotal:"):
                    return f"{int(line.split()[1]) / 1024**2:.2f} GB"
    except OSError:
        pass
    return "unknown"


def _gpu_description() -> tuple[str, str | None]:

    count = visible_gpu_count()
    if count > 0:
        import torch

        names = sorted({torch.cuda.get_device_name(i) for i in range(count)})
        return "CUDA", f"{count} x {', '.join(names)}"
    if sys.platform == "darwin":
        import torch

        if torch.backends.mps.is_available():
            return "MPS", platform.processor() or "Apple Silicon"
    return "N/A", None


def collect_info(config_file: str | None) -> tuple[dict[str, str], dict[str, Any] | str]:
    """Return (versions and hardware by label, the config file settings or why it was not read)."""

    accelerator, gpu = _gpu_description()
    info = {
        "`Cadence` version": _version("cadence"),
        "Platform": platform.platform(),
        "`cadence` command location": shutil.which("cadence") or "Not found",
        "Python version": platform.python_version(),
        "Numpy version": _version("numpy"),
        "PyTorch version": _version("torch"),
        "PyTorch accelerator": accelerator,
        "CPU": f"{platform.machine()}, {usable_cpu_count()} usable cores",
        "System RAM": _memory_gib(),
    }
    if gpu:
        info["GPU type"] = gpu
    path = config_file or str(default_config_path())
    config: dict[str, Any] | str
    if config_file is None and not default_config_path().is_file():
        config = "Not found"
    else:
        try:
            config = load_config_from_file(path).to_dict()
        except ConfigFileError as err:
            config = f"unreadable: {err}"
    return info, config


def env_command(args: argparse.Namespace) -> int:
    """`cadence env`: print versions, hardware and the config, for bug reports; exit code 0.

    Args:
        args (argparse.Namespace): The parsed `env` arguments.

    Returns:
        int: 0.
    """
    info, config = collect_info(args.config_file)
    print("\nCopy-and-paste the text below in your GitHub issue\n")
    print("\n".join(f"- {key}: {value}" for key, value in info.items()))
    print(
        "- `Cadence` default config:" if args.config_file is None else "- `Cadence` config passed:"
    )
    if isinstance(config, dict):
        print("\n".join(f"\t- {key}: {value}" for key, value in config.items()))
    else:
        print(f"\t{config}")
    return 0


def env_command_parser(subparsers: Any = None) -> argparse.ArgumentParser:
    """The `env` parser: added to `subparsers` when given, standalone otherwise.

    Args:
        subparsers (Any): The subparsers action of the `cadence` parser; None builds a standalone parser.

    Returns:
        argparse.ArgumentParser: The parser.
    """
    from .parser_compat import (
        command_parser,  # deferred: loaded when the command runs (keeps `cadence --help` fast)
    )

    return command_parser(register, "env", subparsers)


def main() -> int:
    """Run `cadence env` with the process arguments."""
    from .parser_compat import (
        run_parser,  # deferred: loaded when the command runs (keeps `cadence --help` fast)
    )

    return run_parser(env_command_parser())
