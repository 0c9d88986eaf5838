"""Import cost of `cadence` on top of `import torch`, interleaved with plain `import torch`.

python benchmarks/bench_import.py [--runs 15]
"""

import argparse
import statistics
import subprocess
import sys
import time


def timed(code: str) -> float:
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], check=True)
    return time.perf_counter() - start


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


if __name__ == "__main__":
    main()
