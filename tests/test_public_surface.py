"""The public surface cannot shrink silently: every module path, name, signature and enum member
of the reference library (recorded in tests/data/reference_surface.json by
benchmarks/dump_reference_surface.py, run with the reference's own interpreter) exists in Cadence.

No network and no import of the reference: the recorded file is the whole expectation.
"""

from __future__ import annotations

import enum
import importlib
import inspect
import json
import re
from pathlib import Path

import pytest

DATA = json.loads((Path(__file__).parent / "data" / "reference_surface.json").read_text())
REFERENCE = DATA["reference"]

# The big-model inference names landed with issue 16: none may be missing any more.
PENDING_BIG_MODEL_NAMES: set[str] = set()

ALLOWED = DATA["allowed_differences"]
ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")


def cadence_path(reference_path: str) -> str:
    return "cadence" + reference_path[len(REFERENCE) :]


def relative(reference_path: str) -> str:
    return reference_path[len(REFERENCE) + 1 :]


# Names the reference binds to the machine's backend when the module loads (its recorded surface is
# a CPU machine's): their kind is checked, not their signature.
MACHINE_DEPENDENT = {
    "cadence.test_utils:memory_allocated_func",
    "cadence.test_utils.testing:memory_allocated_func",
}


def signature_of(obj: object) -> list[list] | None:
    try:
        signature = inspect.signature(obj)
    except (TypeError, ValueError):
        return None
    out = []
    for parameter in signature.parameters.values():
        default = (
            None
            if parameter.default is inspect.Parameter.empty
            else ADDRESS.sub("", repr(parameter.default))
        )
        out.append([parameter.name, parameter.kind.name, default])
    return out


def problems_in(reference_path: str) -> list[str]:
    module_key = relative(reference_path)
    try:
        module = importlib.import_module(cadence_path(reference_path))
    except ModuleNotFoundError as error:
        if module_key in PENDING_BIG_MODEL_NAMES and error.name == cadence_path(reference_path):
            return []
        return [f"module {cadence_path(reference_path)} cannot be imported: {error}"]
    found = []
    for name, expected in DATA["modules"][reference_path].items():
        key = f"{cadence_path(reference_path)}:{name}"
        if not hasattr(module, name):
            if name not in PENDING_BIG_MODEL_NAMES:
                found.append(f"{key} is missing")
            continue
        if key in ALLOWED or f"*:{name}" in ALLOWED:
            continue
        value = getattr(module, name)
        kind = expected["kind"]
        if kind == "enum":
            if not (inspect.isclass(value) and issubclass(value, enum.Enum)):
                found.append(f"{key} is not an enum")
                continue
            for member, member_value in expected["members"].items():
                if member not in value.__members__:
                    found.append(f"{key}.{member} is missing")
                elif repr(value.__members__[member].value) != member_value:
                    found.append(f"{key}.{member} has value {value.__members__[member].value!r}")
        elif kind in ("class", "function"):
            if not callable(value):
                found.append(f"{key} is not callable")
                continue
            if kind == "class" and not inspect.isclass(value):
                found.append(f"{key} is not a class")
                continue
            if key in MACHINE_DEPENDENT:
                continue  # bound to this machine's backend (torch.cuda.memory_allocated on a GPU)
            if expected["signature"] is not None and signature_of(value) != expected["signature"]:
                found.append(
                    f"{key} signature {signature_of(value)} != reference {expected['signature']}"
                )
        elif kind == "constant":
            if ADDRESS.sub("", repr(value)) != expected["value"]:
                found.append(f"{key} = {value!r}, reference {expected['value']}")
    return found


@pytest.mark.parametrize("reference_path", sorted(DATA["modules"]))
def test_module_surface_matches_reference(reference_path: str) -> None:
    problems = problems_in(reference_path)
    assert not problems, "\n".join(problems)


def test_reference_modules_that_needed_missing_packages_still_exist() -> None:
    # The dump could not import these in its venv (an optional package was absent); the module
    # path must still exist in Cadence and fail only when used.
    for reference_path in DATA["unimportable_modules"]:
        assert importlib.util.find_spec(cadence_path(reference_path)) is not None, reference_path


@pytest.mark.parametrize("script", DATA["test_scripts"])
def test_bundled_test_scripts_exist(script: str) -> None:
    spec = importlib.util.find_spec(f"cadence.test_utils.scripts.{script}")
    assert spec is not None and spec.origin.endswith(".py"), script


def test_allowed_differences_name_real_entries_and_give_reasons() -> None:
    recorded = {
        f"{cadence_path(module)}:{name}"
        for module, names in DATA["modules"].items()
        for name in names
    }
    recorded |= {f"*:{name}" for names in DATA["modules"].values() for name in names}
    for key, reason in ALLOWED.items():
        assert key in recorded, f"allowed difference {key} is not a reference name"
        assert isinstance(reason, str) and len(reason) > 20, f"{key}: give the reason"


def test_the_surface_file_is_complete() -> None:
    # A guard against an accidentally truncated data file.
    total = sum(len(names) for names in DATA["modules"].values())
    assert len(DATA["modules"]) >= 60 and total >= 900, (len(DATA["modules"]), total)
    assert "accelerate.utils" in DATA["modules"] and len(DATA["modules"]["accelerate.utils"]) >= 260
