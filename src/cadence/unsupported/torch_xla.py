"""TPU tooling Cadence does not drive: installing torch_xla in a Colab runtime, launching on multi-host
TPU pods and `tpu-config`. Present so scripts import; every use raises. (Training on XLA devices itself
is supported: `strategies/xla.py`, `cadence launch --tpu`.)"""

from __future__ import annotations

from typing import Any

from . import unsupported

FEATURE = "the TPU tooling (torch_xla installation in Colab, multi-host TPU pods, tpu-config)"
INSTEAD = (
    "Install torch_xla with pip yourself; Cadence trains on one host's XLA devices "
    "(`cadence launch --tpu script.py`, run on every host of a pod)."
)


def install_xla(upgrade: bool = False) -> None:
    """Install torch_xla in a Colab TPU runtime (unsupported)."""
    unsupported("install_xla", FEATURE, INSTEAD)


def tpu_pod_launcher(args: Any) -> None:
    """Launch a script on a TPU pod (unsupported)."""
    unsupported("tpu_pod_launcher", FEATURE, INSTEAD)


def tpu_command_parser(subparsers: Any = None) -> Any:
    """The `tpu-config` subcommand's parser (unsupported)."""
    return unsupported("tpu_command_parser", FEATURE, INSTEAD)


def tpu_command_launcher(args: Any) -> None:
    """Run setup commands on TPU VMs (unsupported)."""
    unsupported("tpu_command_launcher", FEATURE, INSTEAD)


def main() -> None:
    """The `tpu-config` command (unsupported)."""
    unsupported("tpu-config", FEATURE, INSTEAD)
