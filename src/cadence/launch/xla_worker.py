"""The process `cadence launch --tpu` starts: import the training script as a module, find its main
function, and run it on every XLA device of this host through torch_xla's `xmp.spawn` (Accelerate's
TPU launcher does the same). `sys.argv` is the script's own arguments, as under `python script.py`.

Usage: `python -m cadence.launch.xla_worker [--function main] [--single] script.py|--module mod [args]`
"""

from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path
from typing import Any

from .env import PrepareForLaunch


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser("cadence.launch.xla_worker", allow_abbrev=False)
    parser.add_argument("--function", default="main")
    parser.add_argument("--single", action="store_true", help="one process (nprocs=1)")
    parser.add_argument("--module", action="store_true")
    parser.add_argument("target")
    parser.add_argument("script_args", nargs=argparse.REMAINDER)
    return parser.parse_args(argv)


def load_main_function(target: str, module: bool, function: str) -> tuple[Any, str]:
    """(the script's main function, the script's file) for `target` (a path, or a module name)."""
    if module:
        name = target
    else:
        path = Path(target).resolve()
        sys.path.insert(0, str(path.parent))
        name = path.stem
    loaded = importlib.import_module(name)
    if not hasattr(loaded, function):
        raise SystemExit(
            f"cadence launch --tpu: {target} has no function named {function!r}. Your training script "
            "should have a function named main, or pass a different value to `--main_training_function`."
        )
    return getattr(loaded, function), getattr(loaded, "__file__", target)


def main(argv: list[str] | None = None) -> None:
    """Import the script, then `xmp.spawn` its main function on the XLA devices."""
    args = _parse(sys.argv[1:] if argv is None else argv)
    function, script_file = load_main_function(args.target, args.module, args.function)
    sys.argv = [script_file, *args.script_args]
    import torch_xla.distributed.xla_multiprocessing as xmp  # optional dependency

    xmp.spawn(PrepareForLaunch(function, "XLA"), args=(), nprocs=1 if args.single else None)


if __name__ == "__main__":
    main()
