"""torch_xla / TPU names: present so scripts import; every use raises (Cadence drives CPU and GPU)."""

from __future__ import annotations

from typing import Any

from . import unsupported

FEATURE = "TPU / torch_xla support"
INSTEAD = "Cadence runs on CPUs and CUDA/ROCm/XPU GPUs through torch.distributed."


def install_xla(upgrade: bool = False) -> None:
    """Install torch_xla in a Colab TPU runtime (unsupported)."""
    unsupported("install_xla", FEATURE, INSTEAD)


def prepare_tpu(args: Any, current_env: dict[str, str], pod: bool = False) -> Any:
    """Environment for a TPU launch (unsupported)."""
    return unsupported("prepare_tpu", FEATURE, INSTEAD)


def tpu_launcher(args: Any) -> None:
    """Launch a script on a TPU VM (unsupported)."""
    unsupported("tpu_launcher", FEATURE, INSTEAD)


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
