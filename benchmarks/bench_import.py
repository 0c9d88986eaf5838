"""Import cost of `cadence` on top of `import torch`, and of the reference library on top of its torch;
and the start-up cost of the `accelerate` alias's `.pth` hook (shipped in the wheel) with its variable
unset and set.

    python benchmarks/bench_import.py [--runs 15] [--reference-python PATH]

Each run is a fresh interpreter; the commands are interleaved (torch alone, `import cadence`,
`from cadence import Accelerator`, and with `--reference-python` the reference's torch alone and
`from accelerate import Accelerator`) so that a busy machine slows them alike. Medians are reported,
each library over the torch of its own interpreter. Without `--reference-python` the reference is
skipped. Exit status 1 when `from cadence import Accelerator` costs more than `--budget-ms` over torch.

Two things that are not the libraries' own cost are handled first. Cadence's sources are compiled to
bytecode (`compileall`), as an installed package is, so that a PYTHONDONTWRITEBYTECODE environment does
not time the compiler. And `--freeze-torch-heap` runs `gc.freeze()` right after `import torch` in every
case: torch leaves ~170k objects behind, and the first full garbage collection after it (100-200 ms on a
2-core machine) comes at whichever allocation crosses the collector's thresholds, which depends on the
counters torch left (they differ between two venvs) as much as on the library; any script pays it soon
after `import torch`. With the flag, each import is timed without that pass. The row
"+ Accelerator(cpu=True), prepare" times a script's first lines too, where that pass is inside the
window for both libraries.

Measured on the 2-core development VM, `--runs 9 --clock cpu`, the reference 1.15.0 in a venv of
its own with the same torch 2.13.0. A plain install (a venv with torch 2.13.0 and `pip install .`, what
a user has; load average 1.4):
    from cadence import Accelerator        +42.3 ms over torch (budget 50: met)
      + Accelerator(cpu=True), prepare    +1391 ms
    reference: from accelerate import ...  +66.8 ms
      + Accelerator(cpu=True), prepare    +1480 ms
In `make test`'s venv (every optional package and its startup `.pth` files, which leave the
collector's counters elsewhere after `import torch`; quiet, load average 0.9):
    from cadence import Accelerator        +107.8 ms over torch (the full collection falls inside)
      + Accelerator(cpu=True), prepare    +1432 ms
    reference: from accelerate import ...  +60.2 ms (the full collection falls after it)
      + Accelerator(cpu=True), prepare    +1424 ms
    with --freeze-torch-heap: Cadence -8 ms (noise: nothing measurable), the reference +39 ms.
A probe with gc.callbacks in the same venvs saw one full collection (~86 ms) inside Cadence's import
and none inside the reference's, and process CPU time from `import torch` to a prepared model of
950-990 ms for Cadence against 980-1000 ms for the reference.

Measured for issue 46 (`--runs 5 --reference-python /tmp/refvenv/bin/python`, Accelerate 1.15.0 and
torch 2.13.0 in a venv of their own; Cadence with torch 2.13.0 and its dependencies only, each in a
venv of its own, as a user installs them; load average 1.6-4.5): after `import torch`,
    from cadence import Accelerator        +40.7 ms wall, 27.8 ms -X importtime self-time
    from accelerate import Accelerator     +64.6 ms wall, 44.2 ms self-time: Cadence 0.63x
    with --freeze-torch-heap (self-time)   Cadence 27.2 ms, Accelerate 42.9 ms: 0.63x
Fault tolerance and context parallelism now load only when asked for (-2 ms). In `make test`'s venv
both libraries pay a full collection of torch's heap (~50 ms) inside their import (after `import
torch` the collector's counters there are one gen-1 pass away from it, because of the optional
packages' start-up files): Cadence 80 ms self-time there; Accelerate 1.15 from the reference venv
run with that venv's interpreter took 291 ms (it also imports the optional packages it finds).
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


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


def import_self_time(python: str, first: str, code: str) -> float:
    """Milliseconds: the sum of `-X importtime`'s self times of the modules `code` imports after
    `first` (torch), in a fresh interpreter (what issue 46 compares)."""
    out = subprocess.run(
        [python, "-X", "importtime", "-c", f"{first}; {code}"],
        capture_output=True,
        text=True,
        check=True,
    ).stderr
    total, started = 0, False
    for line in out.splitlines():
        parts = line.split("|")
        if len(parts) != 3 or not parts[0].strip().split(":")[-1].strip().isdigit():
            continue
        name = parts[2]
        if name.strip() == "torch" and len(name) - len(name.lstrip()) == 1:
            started = True  # everything torch imported is before this line
            continue
        if started:
            total += int(parts[0].split(":")[-1])
    return total / 1000


def hook_cost(runs: int) -> None:
    """Interpreter start-up with a site folder holding the wheel's hook vs an empty one."""
    tree = ast.parse((Path(__file__).resolve().parents[1] / "setup.py").read_text())
    found = {
        node.targets[0].id: ast.literal_eval(node.value)
        for node in tree.body
        if isinstance(node, ast.Assign)
        and getattr(node.targets[0], "id", "") in ("PTH_NAME", "PTH_LINE")
    }
    env = {k: v for k, v in os.environ.items() if k != "CADENCE_AS_ACCELERATE"}

    def start(folder: str, extra: dict[str, str]) -> float:
        begin = time.perf_counter()
        code = f"import site; site.addsitedir({folder!r})"
        subprocess.run([sys.executable, "-c", code], check=True, env={**env, **extra})
        return time.perf_counter() - begin

    with tempfile.TemporaryDirectory() as empty, tempfile.TemporaryDirectory() as hooked:
        Path(hooked, found["PTH_NAME"]).write_text(found["PTH_LINE"])
        without, off, on = [], [], []
        for _ in range(runs):
            without.append(start(empty, {}))
            off.append(start(hooked, {}))
            on.append(start(hooked, {"CADENCE_AS_ACCELERATE": "1"}))
    base = statistics.median(without)
    print(f"{'python start-up':48s} median {base * 1000:7.1f} ms")
    print(
        f"{'  + alias hook, variable unset':48s} median {(statistics.median(off) - base) * 1000:+6.1f} ms"
        "  (the hook reads one variable; nothing of Cadence is imported)"
    )
    print(
        f"{'  + alias hook, variable set':48s} median {(statistics.median(on) - base) * 1000:+6.1f} ms"
    )


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
        "--freeze-torch-heap",
        action="store_true",
        help="gc.freeze() after `import torch` in every case (see the module docstring)",
    )
    parser.add_argument(
        "--clock",
        choices=("wall", "cpu"),
        default="wall",
        help="wall time (default), or the child's CPU time on a machine busy with other work",
    )
    args = parser.parse_args()
    ours = sys.executable
    torch_ = "import torch, gc; gc.freeze()" if args.freeze_torch_heap else "import torch"
    # A script's first lines after the import: where the full garbage collection over torch's objects
    # lands (inside Cadence's import, after the reference's) no longer matters there.
    first_steps = (
        "; acc = Accelerator(cpu=True); m = torch.nn.Linear(8, 8)"
        "; acc.prepare(m, torch.optim.SGD(m.parameters(), lr=0.1))"
    )
    cases = {
        "import torch": (ours, torch_),
        "import cadence": (ours, f"{torch_}; import cadence"),
        "from cadence import Accelerator": (ours, f"{torch_}; from cadence import Accelerator"),
        "  + Accelerator(cpu=True), prepare": (
            ours,
            f"{torch_}; from cadence import Accelerator{first_steps}",
        ),
    }
    if args.reference_python:
        cases["reference: import torch"] = (args.reference_python, torch_)
        cases["reference: from accelerate import Accelerator"] = (
            args.reference_python,
            f"{torch_}; from accelerate import Accelerator",
        )
        cases["reference:   + Accelerator(cpu=True), prepare"] = (
            args.reference_python,
            f"{torch_}; from accelerate import Accelerator{first_steps}",
        )
    package = importlib.util.find_spec("cadence").submodule_search_locations[0]
    subprocess.run([ours, "-m", "compileall", "-q", package], check=True, stdout=subprocess.DEVNULL)
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
    for name in (
        "import cadence",
        "from cadence import Accelerator",
        "  + Accelerator(cpu=True), prepare",
    ):
        over[name] = median[name] - median["import torch"]
        print(f"{name:48s} median +{over[name]:6.1f} ms over torch")
    if args.reference_python:
        for name, ours_name in (
            ("reference: from accelerate import Accelerator", "from cadence import Accelerator"),
            ("reference:   + Accelerator(cpu=True), prepare", "  + Accelerator(cpu=True), prepare"),
        ):
            extra = median[name] - median["reference: import torch"]
            print(
                f"{name:48s} median +{extra:6.1f} ms over its torch; Cadence / Accelerate "
                f"{over[ours_name] / extra:.2f}x"
            )
        for label, code in (
            ("self-time", torch_),
            ("self-time, torch's heap frozen", "import torch, gc; gc.freeze()"),
        ):
            ours_self = statistics.median(
                import_self_time(ours, code, "from cadence import Accelerator")
                for _ in range(args.runs)
            )
            theirs_self = statistics.median(
                import_self_time(args.reference_python, code, "from accelerate import Accelerator")
                for _ in range(args.runs)
            )
            print(
                f"{'-X importtime ' + label + ' after torch':48s} Cadence {ours_self:5.1f} ms, "
                f"Accelerate {theirs_self:5.1f} ms: {ours_self / theirs_self:.2f}x"
            )
    hook_cost(args.runs)
    within = over["from cadence import Accelerator"] <= args.budget_ms
    print(
        f"budget: from cadence import Accelerator within {args.budget_ms:.0f} ms of torch: {within}"
    )
    return 0 if within else 1


if __name__ == "__main__":
    sys.exit(main())
