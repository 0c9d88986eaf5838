"""CLI start-up and launch overhead of `cadence` against PyTorch's own launcher, measured in one run.

1. `cadence --help` start-up time, against `python -m torch.distributed.run --help` and a bare interpreter.
2. Wall time of `cadence launch --num_processes 2 trivial.py` against
   `python -m torch.distributed.run --nproc_per_node 2 trivial.py` on the same script, interleaved.

Run: .venv/bin/python benchmarks/bench_cli.py [--rounds N]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TRIVIAL_SCRIPT = """\
import torch
import torch.distributed as dist

torch.set_num_threads(1)
dist.init_process_group("gloo")
dist.barrier()
dist.destroy_process_group()
"""


def wall_time(command: list[str], env: dict[str, str], cwd: str) -> float:
    start = time.perf_counter()
    result = subprocess.run(
        command, env=env, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    elapsed = time.perf_counter() - start
    if result.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed:\n{result.stderr.decode()[-2000:]}")
    return elapsed


def interleaved(
    commands: dict[str, list[str]], rounds: int, env: dict[str, str], cwd: str
) -> dict[str, float]:
    """Median wall time per command, running the commands in turn each round."""
    times: dict[str, list[float]] = {name: [] for name in commands}
    for _ in range(rounds):
        for name, command in commands.items():
            times[name].append(wall_time(command, env, cwd))
    return {name: statistics.median(values) for name, values in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--rounds", type=int, default=5, help="launch rounds per command (default 5)"
    )
    parser.add_argument(
        "--help_rounds", type=int, default=20, help="start-up rounds per command (default 20)"
    )
    options = parser.parse_args()

    python = sys.executable
    cadence = str(Path(python).parent / "cadence")
    if not Path(cadence).exists():
        cadence_cmd = [python, "-m", "cadence.commands.cli"]
    else:
        cadence_cmd = [cadence]
    with tempfile.TemporaryDirectory(prefix="bench-cli-") as workdir:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("CADENCE_", "PET_"))}
        env["HF_HOME"] = os.path.join(
            workdir, "hf"
        )  # no config file: the same defaults for everyone
        env["OMP_NUM_THREADS"] = "1"
        script = os.path.join(workdir, "trivial.py")
        Path(script).write_text(TRIVIAL_SCRIPT)

        startup = interleaved(
            {
                "python -c pass": [python, "-c", "pass"],
                "cadence --help": [*cadence_cmd, "--help"],
                "cadence config --help": [*cadence_cmd, "config", "--help"],
                "torchrun --help": [python, "-m", "torch.distributed.run", "--help"],
            },
            options.help_rounds,
            env,
            workdir,
        )
        print("Start-up (median wall time):")
        for name, seconds in startup.items():
            print(f"  {name:<24} {seconds * 1000:8.1f} ms")
        print(
            f"  ratio cadence --help / torchrun --help: {startup['cadence --help'] / startup['torchrun --help']:.3f}"
        )

        launches = interleaved(
            {
                "cadence launch": [
                    *cadence_cmd,
                    "launch",
                    "--quiet",
                    "--num_processes",
                    "2",
                    script,
                ],
                "torchrun": [
                    python,
                    "-m",
                    "torch.distributed.run",
                    "--nproc_per_node",
                    "2",
                    script,
                ],
            },
            options.rounds,
            env,
            workdir,
        )
        print(f"Launch of 2 gloo processes running a trivial script (median of {options.rounds}):")
        for name, seconds in launches.items():
            print(f"  {name:<24} {seconds:8.3f} s")
        print(
            f"  ratio cadence launch / torchrun: {launches['cadence launch'] / launches['torchrun']:.3f}"
        )


if __name__ == "__main__":
    main()
