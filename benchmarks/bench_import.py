"""Import cost of `cadence` on top of `import torch`, and of the reference library on top of its torch.

    python benchmarks/bench_import.py [--runs 15] [--reference-python PATH]

Each run is a fresh interpreter; the commands are interleaved (torch alone, `import cadence`,
`from cadence import Accelerator`, and with `--reference-python` the reference's torch alone and
`from accelerate import Accelerator`) so that a busy machine slows them alike. Medians are reported,
each library over the torch of its own interpreter. Without `--reference-python` the reference is
skipped. Exit status 1 when `from cadence import Accelerator` costs more than `--budget-ms` over torch.
"""

from __future__ import annotations

import argparse
import resource
import statistics
import subprocess
import sys
import time


def timed(python: str, code: str, clock: str = "wall") -> float:
    """Seconds `python -c code` takes in a fresh interpreter: wall time, or (clock="cpu") the CPU time
    of the child, which a machine busy with other work inflates much less."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run([python, "-c", code], check=True)
    if clock == "wall":
        return time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument(
        "--reference-python",
        default=None,
        help="the interpreter of a venv with the reference library (skipped when not given)",
    )
    parser.add_argument("--budget-ms", type=float, default=50.0)
    parser.add_argument(
        "--clock",
        choices=("wall", "cpu"),
        default="wall",
        help="wall time (default), or the child's CPU time on a machine busy with other work",
    )
    args = parser.parse_args()
    ours = sys.executable
    cases = {
        "import torch": (ours, "import torch"),
        "import cadence": (ours, "import torch, cadence"),
        "from cadence import Accelerator": (ours, "import torch; from cadence import Accelerator"),
    }
    if args.reference_python:
        cases["reference: import torch"] = (args.reference_python, "import torch")
        cases["reference: from accelerate import Accelerator"] = (
            args.reference_python,
            "import torch; from accelerate import Accelerator",
        )
    for python, _ in set(cases.values()):
        timed(python, "import torch")  # warm the file cache
    samples: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(args.runs):
        for name, (python, code) in cases.items():
            samples[name].append(timed(python, code, args.clock))
    median = {name: statistics.median(values) * 1000 for name, values in samples.items()}
    print(
        f"{'import torch':48s} median {median['import torch']:7.1f} ms ({args.runs} runs, {args.clock})"
    )
    over = {}
    for name in ("import cadence", "from cadence import Accelerator"):
        over[name] = median[name] - median["import torch"]
        print(f"{name:48s} median +{over[name]:6.1f} ms over torch")
    if args.reference_python:
        name = "reference: from accelerate import Accelerator"
        extra = median[name] - median["reference: import torch"]
        print(f"{name:48s} median +{extra:6.1f} ms over its torch")
    within = over["from cadence import Accelerator"] <= args.budget_ms
    print(
        f"budget: from cadence import Accelerator within {args.budget_ms:.0f} ms of torch: {within}"
    )
    return 0 if within else 1


if __name__ == "__main__":
    sys.exit(main())
