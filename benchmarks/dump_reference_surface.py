"""Write `tests/data/reference_surface.json`: the reference library's public surface.

Run with the reference's own interpreter (never imported by the tests, which only read the JSON):

    /work/ref-venv/bin/python benchmarks/dump_reference_surface.py

For every public module path of the reference it records the public names, each with its kind,
its call signature (parameter names, kinds and default reprs), enum members and, for simple
constants, the value's repr. "Public" means:

* a package (`__init__`) that re-exports: every attribute not starting with `_` that is not a module;
* any other module: its `__all__` if it has one, else the classes and functions defined in it
  (``obj.__module__`` is the module) plus the simple constants assigned at its top level.

The `allowed_differences` section is carried over from the existing file: it is written by hand.
"""

from __future__ import annotations

import ast
import enum
import importlib
import inspect
import json
import pkgutil
import re
import sys
from pathlib import Path

REFERENCE = "accelerate"
OUTPUT = Path(__file__).resolve().parent.parent / "tests" / "data" / "reference_surface.json"

# Interactive terminal menus and the bundled test scripts are not import surfaces.
SKIPPED_PREFIXES = (
    f"{REFERENCE}.commands.menu",
    f"{REFERENCE}.test_utils.scripts",
)
SIMPLE_CONSTANT_TYPES = (str, int, float, bool, tuple, list, dict, set, frozenset, type(None))
ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")


def default_repr(value: object) -> str:
    """A stable repr: object addresses removed so two runs write the same file."""
    return ADDRESS.sub("", repr(value))


def describe_signature(obj: object) -> list[list] | None:
    try:
        signature = inspect.signature(obj)
    except (TypeError, ValueError):
        return None
    parameters = []
    for parameter in signature.parameters.values():
        default = (
            None
            if parameter.default is inspect.Parameter.empty
            else default_repr(parameter.default)
        )
        parameters.append([parameter.name, parameter.kind.name, default])
    return parameters


def top_level_assignments(module) -> set[str]:
    try:
        source = inspect.getsource(module)
    except (OSError, TypeError):
        return set()
    names: set[str] = set()
    for node in ast.parse(source).body:
        targets = []
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, ast.AnnAssign):
            targets = [node.target]
        for target in targets:
            if isinstance(target, ast.Name):
                names.add(target.id)
    return names


def public_names(module) -> list[str]:
    is_package = hasattr(module, "__path__")
    if is_package:
        return sorted(
            name
            for name, value in vars(module).items()
            if not name.startswith("_") and not inspect.ismodule(value)
        )
    if hasattr(module, "__all__"):
        return sorted(module.__all__)
    assigned = top_level_assignments(module)
    names = []
    for name, value in vars(module).items():
        if name.startswith("_") or inspect.ismodule(value):
            continue
        # callable() also catches functions wrapped by functools.lru_cache or a decorator class
        if callable(value) and getattr(value, "__module__", None) == module.__name__:
            names.append(name)
        elif name in assigned and isinstance(value, SIMPLE_CONSTANT_TYPES):
            names.append(name)
    return sorted(names)


def conditional_exports(package) -> dict[str, str]:
    """Names a package imports inside `if <package available>:` blocks, mapped to their module.

    The reference's `utils/__init__` exports the DeepSpeed and Megatron-LM helpers only when those
    packages are installed; a script written on a machine that has them imports them, so they are
    part of the surface whether or not this venv has the package.
    """
    found: dict[str, str] = {}
    tree = ast.parse(inspect.getsource(package))
    for node in tree.body:
        if not isinstance(node, ast.If):
            continue
        for inner in ast.walk(node):
            if isinstance(inner, ast.ImportFrom) and inner.level == 1 and inner.module:
                for alias in inner.names:
                    found[alias.asname or alias.name] = f"{package.__name__}.{inner.module}"
    return found


def describe(value: object) -> dict:
    if inspect.isclass(value) and issubclass(value, enum.Enum):
        return {"kind": "enum", "members": {m.name: default_repr(m.value) for m in value}}
    if inspect.isclass(value):
        return {"kind": "class", "signature": describe_signature(value)}
    if callable(value):
        return {"kind": "function", "signature": describe_signature(value)}
    if isinstance(value, SIMPLE_CONSTANT_TYPES):
        return {"kind": "constant", "value": default_repr(value)}
    return {"kind": "value", "type": type(value).__name__}


def walk_modules() -> list[str]:
    root = importlib.import_module(REFERENCE)
    found = [REFERENCE]
    for info in pkgutil.walk_packages(root.__path__, prefix=f"{REFERENCE}."):
        if (
            info.name.startswith(SKIPPED_PREFIXES)
            and info.name != f"{REFERENCE}.test_utils.scripts"
        ):
            continue
        found.append(info.name)
    return sorted(found)


def main() -> int:
    modules: dict[str, dict] = {}
    unimportable: dict[str, str] = {}
    for module_name in walk_modules():
        try:
            module = importlib.import_module(module_name)
        except Exception as error:  # a module needing a package this venv lacks
            unimportable[module_name] = f"{type(error).__name__}: {error}"
            continue
        names = {name: describe(getattr(module, name)) for name in public_names(module)}
        if hasattr(module, "__path__"):
            for name, source_module in conditional_exports(module).items():
                if name.startswith("_") or name in names:
                    continue
                try:
                    source = importlib.import_module(source_module)
                except Exception:
                    continue
                original = name.removeprefix("megatron_lm_")
                if hasattr(source, original):
                    names[name] = describe(getattr(source, original))
        modules[module_name] = names

    scripts_root = Path(importlib.import_module(f"{REFERENCE}.test_utils.scripts").__path__[0])
    scripts = sorted(
        str(path.relative_to(scripts_root).with_suffix("")).replace("/", ".")
        for path in scripts_root.rglob("*.py")
        if path.name != "__init__.py"
    )

    previous = json.loads(OUTPUT.read_text()) if OUTPUT.exists() else {}
    document = {
        "reference": REFERENCE,
        "reference_version": importlib.import_module(REFERENCE).__version__,
        "python": sys.version.split()[0],
        "generated_by": "benchmarks/dump_reference_surface.py",
        "modules": modules,
        "unimportable_modules": unimportable,
        "test_scripts": scripts,
        "allowed_differences": previous.get("allowed_differences", {}),
    }
    OUTPUT.parent.mkdir(parents=True, exist_ok=True)
    OUTPUT.write_text(json.dumps(document, indent=1, sort_keys=True) + "\n")
    total = sum(len(names) for names in modules.values())
    print(
        f"{len(modules)} module paths, {total} names, {len(unimportable)} unimportable -> {OUTPUT}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
