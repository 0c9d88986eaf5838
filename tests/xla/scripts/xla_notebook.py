"""notebook_launcher on XLA (PJRT_DEVICE=CPU): the function runs under torch_xla's launcher with the
requested precision; an Accelerator created before the launch is refused. Prints one JSON report."""

from __future__ import annotations

import json
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(__file__))
from xla_common import report, train_plainly  # noqa: E402

from cadence import Accelerator, notebook_launcher  # noqa: E402


def training_function(out_file: str) -> None:
    accelerator = Accelerator()
    losses = train_plainly(accelerator)
    with open(out_file, "w") as handle:
        json.dump(
            {
                "distributed_type": accelerator.distributed_type.value,
                "device_type": accelerator.device.type,
                "mixed_precision": accelerator.mixed_precision,
                "pid": os.getpid(),
                "losses": losses,
            },
            handle,
        )


if __name__ == "__main__":
    results: dict = {"parent_pid": os.getpid()}
    with tempfile.TemporaryDirectory() as folder:
        out = os.path.join(folder, "out.json")
        notebook_launcher(training_function, (out,), mixed_precision="bf16")
        with open(out) as handle:
            results["child"] = json.load(handle)
    Accelerator()
    try:
        notebook_launcher(training_function, ("unused",))
        results["after_accelerator"] = None
    except ValueError as error:
        results["after_accelerator"] = str(error)
    report(results)
