"""Run the same cases with the reference and with Cadence, and print the results side by side.

    python compat/run.py --reference-venv REF_VENV --cadence-venv CADENCE_VENV [--cases trainer trl ...]

REF_VENV has accelerate (and transformers, peft, trl, diffusers, datasets); CADENCE_VENV has Cadence
installed (its wheel's startup hook) and the same libraries, without accelerate: the cases run there
with CADENCE_AS_ACCELERATE=1. Printed: every final-weight digest and check of each case from both
venvs ("same" when equal) and the Trainer's steps/s. Offline; each case in a fresh temporary folder.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

CASES = Path(__file__).resolve().parent / "cases"

# name -> (script, how to start it: "python" or "2 processes")
CASE_TABLE = {
    "trainer": ("trainer_cases.py", "python"),
    "trl": ("trl_cases.py", "python"),
    "diffusers": ("diffusers_cases.py", "python"),
    "trainer_1proc": ("trainer_ddp.py", "python"),
    "trainer_2proc": ("trainer_ddp.py", "2 processes"),
}


def environment(folder: Path, alias: bool) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("CADENCE_", "PYTHONPATH", "VIRTUAL_ENV"))
    }
    env.update(
        HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", HF_DATASETS_OFFLINE="1",
        HF_HOME=str(folder / "hf"), CUDA_VISIBLE_DEVICES="", OMP_NUM_THREADS="1",
        TOKENIZERS_PARALLELISM="false",
    )  # fmt: skip
    if alias:
        env["CADENCE_AS_ACCELERATE"] = "1"
    return env


def command(venv: Path, script: str, how: str) -> list[str]:
    python = str(venv / "bin" / "python")
    if how == "python":
        return [python, str(CASES / script)]
    # torch's own launcher in both venvs (the same two processes; the alias is inherited)
    return [python, "-m", "torch.distributed.run", "--nproc_per_node", "2", str(CASES / script)]


def run_case(venv: Path, alias: bool, name: str) -> dict:
    script, how = CASE_TABLE[name]
    with tempfile.TemporaryDirectory(prefix=f"compat-{name}-") as folder:
        out = Path(folder, "out")
        out.mkdir()
        done = subprocess.run(
            [*command(venv, script, how), str(out)],
            cwd=folder,
            env=environment(Path(folder), alias),
            capture_output=True,
            text=True,
        )
    for line in done.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT ") :])
    return {"error": (done.stderr or done.stdout).strip().splitlines()[-1:]}


def check_venvs(reference: Path, cadence: Path) -> None:
    probe = (
        "import importlib.machinery as m; print(m.PathFinder.find_spec('accelerate') is not None)"
    )
    for venv, wanted in ((reference, "True"), (cadence, "False")):
        found = subprocess.run(
            [str(venv / "bin" / "python"), "-c", probe],
            env=environment(Path(tempfile.gettempdir()), alias=False),
            capture_output=True,
            text=True,
        ).stdout.strip()
        if found != wanted:
            state = "has" if found == "True" else "lacks"
            sys.exit(
                f"{venv} {state} accelerate: the reference venv needs it, the Cadence venv must not."
            )


def show(name: str, reference: dict, cadence: dict) -> int:
    differing = 0
    for key in sorted(set(reference) | set(cadence)):
        if key.endswith("_weights"):
            continue
        ref, cad = reference.get(key), cadence.get(key)
        if key == "steps_per_second":
            mark = "faster" if (cad or 0) >= (ref or 0) else "slower"
        else:
            mark = "same" if ref == cad else "DIFFERENT"
            differing += ref != cad
        print(f"{name:14s} {key:26s} {json.dumps(ref):24s} {json.dumps(cad):24s} {mark}")
    return differing


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reference-venv", type=Path, required=True)
    parser.add_argument("--cadence-venv", type=Path, required=True)
    parser.add_argument("--cases", nargs="+", choices=sorted(CASE_TABLE), default=list(CASE_TABLE))
    args = parser.parse_args()
    check_venvs(args.reference_venv, args.cadence_venv)
    print(f"{'case':14s} {'result':26s} {'reference':24s} {'cadence':24s}")
    differing = 0
    for name in args.cases:
        reference = run_case(args.reference_venv, alias=False, name=name)
        cadence = run_case(args.cadence_venv, alias=True, name=name)
        differing += show(name, reference, cadence)
    print(f"{differing} result(s) differ")
    return 1 if differing else 0


if __name__ == "__main__":
    sys.exit(main())
