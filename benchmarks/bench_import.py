"""Import cost of `cadence` on top of `import torch`, interleaved with plain `import torch`; and the
start-up cost of the `accelerate` alias's `.pth` hook (shipped in the wheel) with its variable unset.

python benchmarks/bench_import.py [--runs 15]
"""

import argparse
import ast
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def timed(code: str, env: dict | None = None) -> float:
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], check=True, env=env)
    return time.perf_counter() - start


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
    with tempfile.TemporaryDirectory() as empty, tempfile.TemporaryDirectory() as hooked:
        Path(hooked, found["PTH_NAME"]).write_text(found["PTH_LINE"])
        without, with_hook = [], []
        for _ in range(runs):
            without.append(timed(f"import site; site.addsitedir({empty!r})", env))
            with_hook.append(timed(f"import site; site.addsitedir({hooked!r})", env))
        on = [timed(f"import site; site.addsitedir({hooked!r})", {**env, "CADENCE_AS_ACCELERATE": "1"})
              for _ in range(runs)]  # fmt: skip
    base = statistics.median(without)
    print(f"python start-up                     median {base * 1000:7.1f} ms")
    print(
        f"  + alias hook, variable unset      median {(statistics.median(with_hook) - base) * 1000:+6.1f} ms"
        "  (the hook reads one variable; nothing of Cadence is imported)"
    )
    print(
        f"  + alias hook, variable set        median {(statistics.median(on) - base) * 1000:+6.1f} ms"
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=15)
    runs = parser.parse_args().runs
    torch_only, with_cadence, with_accelerator = [], [], []
    timed("import torch")  # warm the file cache
    for _ in range(runs):
        torch_only.append(timed("import torch"))
        with_cadence.append(timed("import torch, cadence"))
        with_accelerator.append(timed("import torch; from cadence import Accelerator"))
    base = statistics.median(torch_only)
    print(f"import torch                        median {base * 1000:7.1f} ms")
    for name, samples in (
        ("import cadence", with_cadence),
        ("from cadence import Accelerator", with_accelerator),
    ):
        extra = statistics.median(samples) - base
        print(f"{name:35s} median +{extra * 1000:6.1f} ms over torch (target < 50 ms)")
    hook_cost(runs)


if __name__ == "__main__":
    main()
