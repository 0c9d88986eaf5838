"""Started by `cadence launch --tpu` (or an XLA config file): `main` runs under torch_xla's launcher.
Prints one JSON report with what the Accelerator saw and a short training's losses."""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
from xla_common import report, train_plainly  # noqa: E402


def main() -> None:
    from cadence import Accelerator

    accelerator = Accelerator()
    losses = train_plainly(accelerator)
    accelerator.print("printed by the main process")
    report(
        {
            "argv": sys.argv[1:],
            "distributed_type": accelerator.distributed_type.value,
            "device_type": accelerator.device.type,
            "num_processes": accelerator.num_processes,
            "mixed_precision": accelerator.mixed_precision,
            "gradient_accumulation_steps": accelerator.gradient_accumulation_steps,
            "losses": losses,
            "fork_launched": os.environ.get("FORK_LAUNCHED"),
        }
    )


if __name__ == "__main__":
    raise SystemExit("run me through `cadence launch --tpu`")
