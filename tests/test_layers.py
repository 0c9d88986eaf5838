"""The package's declared layers, checked on the source: each module imports only modules of its own
layer or of the layers below it, no import cycle exists inside the package (imports inside functions
count), a deferred (function-level) import of a Cadence module says why on its line, and no function
takes the whole Accelerator.

The layers, bottom to top, are declared once in `cadence._layers` (ARCHITECTURE.md draws them).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import cadence
from cadence._layers import LAYERS as CADENCE_LAYERS

PACKAGE_ROOT = Path(cadence.__file__).parent

# Bottom to top, read from the package (cadence/_layers.py): a module belongs to the first entry that is
# its name or a package above it.
LAYERS: list[tuple[str, ...]] = [members for _name, members in CADENCE_LAYERS]

DEFERRED_MARK = "# deferred:"


def _modules() -> dict[str, Path]:
    modules = {}
    for path in PACKAGE_ROOT.rglob("*.py"):
        parts = path.relative_to(PACKAGE_ROOT.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        modules[name] = path
    return modules


MODULES = _modules()


def layer_of(module: str) -> int:
    for index, members in enumerate(LAYERS):
        for member in members:
            if module == member or (member != "cadence" and module.startswith(member + ".")):
                return index
    if module == "cadence":
        return len(LAYERS) - 1
    raise AssertionError(
        f"{module} is in no declared layer: add it to cadence/_layers.py (and ARCHITECTURE.md)"
    )


def _resolve(name: str) -> str | None:
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def imports_of(module: str) -> list[tuple[str, int, bool, str]]:
    """(imported Cadence module, line, inside a function, source line) for each import statement."""
    path = MODULES[module]
    source = path.read_text()
    lines = source.splitlines()
    tree = ast.parse(source)
    is_package = path.name == "__init__.py"
    base = module.split(".") if is_package else module.split(".")[:-1]
    in_function: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            in_function.update(id(sub) for sub in ast.walk(node))
    found = []
    for node in ast.walk(tree):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                prefix = base[: len(base) - (node.level - 1)]
                parent = ".".join(prefix + ([node.module] if node.module else []))
            else:
                parent = node.module or ""
            # `from . import x` imports the submodule x, not the package.
            targets = [
                f"{parent}.{alias.name}" if f"{parent}.{alias.name}" in MODULES else parent
                for alias in node.names
            ]
        for target in targets:
            resolved = _resolve(target)
            if resolved is None or not resolved.startswith("cadence") or resolved == module:
                continue
            if is_package and resolved.startswith(module + "."):
                continue  # a package importing its own submodules
            text = "\n".join(lines[node.lineno - 1 : node.end_lineno])
            found.append((resolved, node.lineno, id(node) in in_function, text))
    return found


def test_every_module_imports_only_its_layer_and_below():
    violations = []
    for module in sorted(MODULES):
        mine = layer_of(module)
        for target, line, _, _ in imports_of(module):
            if layer_of(target) > mine:
                violations.append(
                    f"{module}:{line} imports {target} (layer {layer_of(target)} > {mine})"
                )
    assert not violations, "\n".join(violations)


def test_no_import_cycle_inside_the_package():
    graph = {m: {t for t, *_ in imports_of(m)} for m in MODULES}
    cycles, state = [], {}

    def visit(node: str, stack: list[str]) -> None:
        state[node] = "open"
        for nxt in sorted(graph[node]):
            if state.get(nxt) == "open":
                cycles.append(stack[stack.index(nxt) :] + [nxt])
            elif nxt not in state:
                visit(nxt, stack + [nxt])
        state[node] = "done"

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])
    assert not cycles, "\n".join(" -> ".join(cycle) for cycle in cycles)


def test_deferred_imports_of_cadence_modules_say_why():
    unmarked = [
        f"{module}:{line}: {text.strip()}"
        for module in sorted(MODULES)
        if not module.startswith("cadence.test_utils.scripts")  # scripts written as a user would
        for _target, line, deferred, text in imports_of(module)
        if deferred and DEFERRED_MARK not in text
    ]
    assert not unmarked, (
        "A function-level import of a Cadence module must end with '# deferred: <why>' "
        "(an optional heavy dependency, or a backend chosen at run time):\n" + "\n".join(unmarked)
    )


# Scripts that play the user (the bundled self-test) may hold an Accelerator, and so may the few
# user-facing helpers whose public signature in the reference takes one (LocalSGD, the FSDP
# save/load helpers, the Megatron-LM names that only raise); components may not.
USER_SCRIPTS = (
    "cadence.selftest",
    "cadence.test_utils",
    "cadence.accelerator.local_sgd",
    "cadence.fsdp_helpers",
    "cadence.unsupported",
)


def test_no_component_takes_the_whole_accelerator():
    offenders = []
    for module, path in sorted(MODULES.items()):
        if module.startswith(USER_SCRIPTS):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.arg) and node.arg == "accelerator":
                offenders.append(f"{module}:{node.lineno}")
    assert not offenders, "parameters named `accelerator`: " + ", ".join(offenders)


def test_layers_name_every_module_once():
    named = [member for members in LAYERS for member in members]
    assert len(named) == len(set(named))
    for module in MODULES:
        layer_of(module)  # raises for a module outside every layer


# The one reader of the environment on the worker side is cadence.core.settings; the launch environment
# (ranks, addresses) is topology's; the launcher side (CLI, launchers, hardware probes) prepares the
# environment of the processes it starts. Writing a variable for a library Cadence drives is allowed.
ENVIRONMENT_READERS = (
    "cadence.core.settings",
    "cadence.core.environment",  # the reference's public environment helpers (patch, parse, purge)
    "cadence.test_utils",  # testing helpers and scripts, written as a user would
    "cadence.runtime.topology",
    "cadence.runtime.hardware",
    "cadence.runtime.cuda_probe",
    # the launcher side: the CLI's entry points and everything below them (the plan, the elastic
    # agent, the worker bootstrap, the notebook launchers, the reference's environment builders)
    "cadence.launch",
    "cadence.commands",
)
_ENV_READ = re.compile(r"os\.environ\.get\(|os\.getenv\(|os\.environ\[[^\]]+\](?!\s*=)")


def test_only_the_settings_resolver_reads_the_environment():
    readers = [
        f"{module}:{number}: {line.strip()}"
        for module, path in sorted(MODULES.items())
        if not module.startswith(ENVIRONMENT_READERS)
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if _ENV_READ.search(line) and not line.lstrip().startswith("#")
    ]
    assert not readers, "read the environment through cadence.core.settings:\n" + "\n".join(readers)


def test_relative_imports_stay_inside_the_package():
    beyond = []
    for module, path in sorted(MODULES.items()):
        package_depth = len(module.split(".")) - (0 if path.name == "__init__.py" else 1)
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level > package_depth:
                beyond.append(f"{module}:{node.lineno}")
    assert not beyond, "relative imports beyond the top-level package: " + ", ".join(beyond)
