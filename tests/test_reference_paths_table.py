"""Each reference module path Cadence keeps only as a re-export is listed in cadence._reference_paths,
is marked the same way, and resolves to the module where the code lives."""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys
from pathlib import Path

import pytest

from cadence._reference_paths import MARK, REFERENCE_PACKAGES, REFERENCE_PATHS

PACKAGE_ROOT = Path(importlib.import_module("cadence").__file__).parent


_CHECK = r"""
import importlib, inspect, sys, warnings
from cadence._reference_paths import MARK, REFERENCE_PATHS
problems = []
for path, homes in REFERENCE_PATHS.items():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # cadence.memory_utils warns, as the reference's
        module = importlib.import_module(path)
    if not (module.__doc__ or "").startswith(MARK):
        problems.append(f"{path}: its docstring does not start with {MARK!r}")
    if not getattr(module, "__all__", None):
        problems.append(f"{path} lists no names in __all__")
    loaded = [m for m in list(sys.modules) if any(m == h or m.startswith(h + ".") for h in homes)]
    for name in module.__all__:
        value = getattr(module, name)
        if inspect.isclass(value) or inspect.isfunction(value):
            where = value.__module__
            defined_at_home = any(where == h or where.startswith(h + ".") for h in homes)
            if not defined_at_home and not any(getattr(sys.modules[h], name, None) is value for h in homes):
                problems.append(f"{path}.{name} comes from {where}, not {homes}")
        elif not any(getattr(sys.modules[m], name, None) is value for m in loaded):
            problems.append(f"{path}.{name} is not the object of {homes}")
print("\n".join(problems) or "ok")
"""


# In a fresh interpreter: importing `cadence.utils.tqdm` binds the submodule over the lazily exported
# function `cadence.utils.tqdm` (as in any package with a lazy namespace), which other tests read.
def test_each_reference_path_reexports_its_home():
    result = subprocess.run(
        [sys.executable, "-c", _CHECK], capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip() == "ok", result.stdout


@pytest.mark.parametrize("path", sorted(REFERENCE_PATHS))
def test_reference_path_defines_nothing(path):
    source = (PACKAGE_ROOT.parent / (path.replace(".", "/") + ".py")).read_text()
    defined = [
        node.name
        for node in ast.parse(source).body
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
    ]
    assert not defined, f"{path} defines {defined}: move them to {REFERENCE_PATHS[path]}"


def test_every_marked_module_is_in_the_table():
    marked = set()
    for file in PACKAGE_ROOT.rglob("*.py"):
        tree = ast.parse(file.read_text())
        if (ast.get_docstring(tree) or "").startswith(MARK):
            parts = file.relative_to(PACKAGE_ROOT.parent).with_suffix("").parts
            marked.add(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    assert marked == set(REFERENCE_PATHS)


@pytest.mark.parametrize("path", REFERENCE_PACKAGES)
def test_reference_packages_are_their_own_home(path):
    assert importlib.import_module(path).__file__.endswith("__init__.py")
