"""TPU tooling Cadence does not drive: installing torch_xla in a Colab runtime and launching on
multi-host TPU pods. Present so scripts import; every use raises. (Training on XLA devices itself is
supported: `strategies/xla.py`, `cadence launch --tpu`; so is `cadence tpu-config`.)"""

from __future__ import annotations

from typing import Any

from . import unsupported

FEATURE = "the TPU tooling (torch_xla installation in Colab, multi-host TPU pods)"
INSTEAD = (
    "Install torch_xla with pip yourself; Cadence trains on one host's XLA devices "
    "(`cadence launch --tpu script.py`, run on every host of a pod)."
)


def install_xla(upgrade: bool = False) -> None:
    """Install torch_xla in a Colab TPU runtime (unsupported).

    Args:
        upgrade (bool): Upgrade torch as well (default False).

    Raises:
        UnsupportedFeatureError: Always (a `NotImplementedError`): installing torch_xla is not supported.
    """
    unsupported("install_xla", FEATURE, INSTEAD)


def tpu_pod_launcher(args: Any) -> None:
    """Launch a script on a TPU pod (unsupported)."""
    unsupported("tpu_pod_launcher", FEATURE, INSTEAD)
