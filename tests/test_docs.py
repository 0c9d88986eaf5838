"""The documentation site: every public name has a docstring, the generated reference covers every
public name and command, and the code examples of the pages run.

The site itself is built by `make docs` (`mkdocs build --strict`, run by .ci/run), which fails on a
broken link or reference; these tests need no mkdocs.
"""

from __future__ import annotations

import argparse
import enum
import importlib
import importlib.util
import inspect
import json
import os
import re
import subprocess
import sys
import warnings
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
SURFACE = json.loads((Path(__file__).parent / "data" / "reference_surface.json").read_text())
REFERENCE = SURFACE["reference"]

# An example block: `<!-- runnable -->`, or `<!-- runnable: NAME=VALUE ... cadence launch FLAGS -->`,
# on the line before a ```python fence.
RUNNABLE = re.compile(
    r"<!-- runnable(?::\s*(?P<spec>.*?))?\s*-->\n```python\n(?P<code>.*?)\n```", re.S
)
EXAMPLE_TIMEOUT_S = 240


def public_modules() -> list[str]:
    return sorted("cadence" + path[len(REFERENCE) :] for path in SURFACE["modules"])


def import_quietly(name: str):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # deprecated reference paths warn on import
        return importlib.import_module(name)


def own_docstring(value: object) -> str:
    """The object's own docstring: not a base class's, not the one dataclasses make up."""
    doc = value.__dict__.get("__doc__") if inspect.isclass(value) else getattr(value, "__doc__", "")
    doc = (doc or "").strip()
    if inspect.isclass(value) and doc.startswith(f"{value.__name__}("):
        return ""  # dataclasses' generated "Name(field: type, ...)"
    return doc


def undocumented_in(module_name: str) -> list[str]:
    module = import_quietly(module_name)
    found = [] if (module.__doc__ or "").strip() else [f"module {module_name}"]
    names = SURFACE["modules"][REFERENCE + module_name[len("cadence") :]]
    for name, recorded in names.items():
        if recorded["kind"] == "constant":
            continue  # values, documented in the module's page table
        value = getattr(module, name)
        if inspect.ismodule(value):
            continue  # checked as a module of its own
        if not getattr(value, "__module__", "").startswith("cadence"):
            continue  # a re-exported object of torch or the standard library: not ours to document
        if not own_docstring(value):
            found.append(f"{module_name}.{name} ({value.__module__})")
    return found


@pytest.mark.parametrize("module_name", public_modules())
def test_every_public_name_has_a_docstring(module_name: str) -> None:
    missing = undocumented_in(module_name)
    assert not missing, "no docstring: " + ", ".join(missing)


def commands(parser: argparse.ArgumentParser, prefix: str = "cadence"):
    """(command line, help of the command, its parser) of every command and subcommand."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {choice.dest: choice.help for choice in action._choices_actions}
            for name, sub in action.choices.items():
                yield f"{prefix} {name}", helps.get(name), sub
                yield from commands(sub, f"{prefix} {name}")


def test_every_command_and_flag_has_a_help_text() -> None:
    from cadence.commands.cli import build_parser

    found = list(commands(build_parser()))
    assert {"cadence launch", "cadence config", "cadence env", "cadence test"} <= {
        c for c, _, _ in found
    }
    missing = []
    for command, help_text, parser in found:
        if not (help_text or "").strip() or not (parser.description or "").strip():
            missing.append(f"{command}: help or description")
        for action in parser._actions:
            if isinstance(action, argparse._HelpAction | argparse._SubParsersAction):
                continue
            if action.help != argparse.SUPPRESS and not (action.help or "").strip():
                missing.append(f"{command} {'/'.join(action.option_strings) or action.dest}")
    assert not missing, "no help text: " + ", ".join(missing)


def load_generator():
    from harness import load_script

    return load_script(DOCS / "gen_pages.py", "docs_gen_pages")


def test_the_generated_reference_shows_every_public_name_and_command() -> None:
    pages = load_generator().pages()
    for path, names in SURFACE["modules"].items():
        module = "cadence" + path[len(REFERENCE) :]
        page = pages[f"reference/{module}.md"]
        assert page.startswith(f"# `{module}`"), module
        for name in names:
            assert f'<a id="{module}.{name}"></a>' in page, f"{module}.{name} is not on its page"
    index = pages["reference/index.md"]
    sections = re.findall(r"^## (.+)$", index, re.M)
    assert sections == [
        "The Accelerator",
        "State",
        "Configuration and plugins",
        "Launchers and the command line",
        "Data",
        "Checkpoints",
        "Trackers and logging",
        "Big models",
        "Utilities",
        "Every module path",
    ], sections
    assert not re.search(r"\bthe reference\b", index, re.I)  # Accelerate is called Accelerate
    for path in SURFACE["modules"]:
        assert f"({'cadence' + path[len(REFERENCE) :]}.md)" in index
    cli = pages["cli.md"]
    from cadence.commands.cli import build_parser

    for command, _, parser in commands(build_parser()):
        assert f"`{command}`" in cli, command
        for action in parser._actions:
            if isinstance(action, argparse._HelpAction):
                continue
            if action.option_strings and action.help != argparse.SUPPRESS:
                assert f"`{action.option_strings[0]}`" in cli, (command, action.option_strings)


def runnable_examples() -> list:
    found = []
    for page in sorted(DOCS.rglob("*.md")):
        text = page.read_text()
        for number, match in enumerate(RUNNABLE.finditer(text), 1):
            name = f"{page.relative_to(DOCS)}#{number}"
            found.append(pytest.param(match["spec"], match["code"], id=name))
    return found


def test_the_pages_have_runnable_examples() -> None:
    pages = {param.id.split("#")[0] for param in runnable_examples()}
    assert {"getting-started.md", "concepts/checkpoints.md", "how-to/notebooks.md"} <= pages, pages


def run_example(folder: Path, spec: str | None, code: str) -> subprocess.CompletedProcess:
    """Run one example as written, in a fresh process on CPU, in an empty folder (a multi-process one
    through `cadence launch`, as its marker says)."""
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("CADENCE_", "ACCELERATE_", "TORCHELASTIC_", "PET_"))
    }
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "PJRT_DEVICE"):
        env.pop(name, None)
    env.update(CUDA_VISIBLE_DEVICES="", HF_HOME=str(folder / "hf"), TMPDIR=str(folder))
    command = [sys.executable, "example.py"]
    words = (spec or "").split()
    while words and re.fullmatch(r"[A-Z_][A-Z0-9_]*=\S*", words[0]):
        key, _, value = words.pop(0).partition("=")
        env[key] = value
    if words:
        if words[:2] != ["cadence", "launch"]:
            raise ValueError(f"unknown runnable marker: {spec!r}")
        command = [sys.executable, "-m", "cadence.commands.cli", "launch", "-q", *words[2:]]
        command.append("example.py")
    (folder / "example.py").write_text(code + "\n")
    return subprocess.run(
        command, cwd=folder, env=env, capture_output=True, text=True, timeout=EXAMPLE_TIMEOUT_S
    )


@pytest.fixture(scope="module")
def example_runs(tmp_path_factory):
    """Every example, run two at a time (each is a few seconds of start-up: torch, processes), so the
    examples cost about half their sequential time; each test then waits for its own result."""
    with ThreadPoolExecutor(max_workers=2) as pool:
        futures = {
            param.id: pool.submit(run_example, tmp_path_factory.mktemp("example"), *param.values)
            for param in runnable_examples()
        }
        yield futures
        for future in futures.values():
            future.cancel()  # what has not started yet, after a failed test run is interrupted


@pytest.mark.parametrize(("spec", "code"), runnable_examples())
def test_docs_example_runs(request, example_runs, spec: str | None, code: str) -> None:
    done = example_runs[request.node.callspec.id].result()
    assert done.returncode == 0, (done.stdout[-3000:], done.stderr[-3000:])


# --- the docstrings of the public callables: every parameter described, examples that run ---------

# The public callables whose parameters are not all described yet, as `module:Qualname`, one a line
# (`python tests/test_docs.py --write-undescribed` rewrites it):
# a ratchet. A name missing here must describe every parameter it takes; a name listed here that
# describes them all (or no longer exists) fails too, so the list only shrinks.
UNDESCRIBED = Path(__file__).parent / "data" / "undescribed_parameters.txt"
# Google-style sections that describe parameters (a dataclass's fields may be its `Attributes:`).
PARAMETER_SECTIONS = ("Args:", "Arguments:", "Parameters:", "Keyword Args:", "Attributes:")
SECTION = re.compile(r"^(?P<indent>\s*)(?P<title>[A-Z][A-Za-z ]*):\s*$")
DESCRIBED = re.compile(r"^\s*(?P<name>\*{0,2}\w+)\s*(\([^)]*\)(\s*\[[^\]]*\])?)?\s*:")


def public_callables() -> dict[str, object]:
    """Every public function, class and public method of a public class of the surface, once, keyed
    `module:Qualname` where it is defined (methods of Cadence base classes included)."""
    found: dict[str, object] = {}

    def add(value: object) -> None:
        module = getattr(value, "__module__", "") or ""
        qualname = getattr(value, "__qualname__", "") or ""
        if module.startswith("cadence") and "<" not in qualname:
            found.setdefault(f"{module}:{qualname}", value)

    for module_name in public_modules():
        module = import_quietly(module_name)
        for name, recorded in SURFACE["modules"][REFERENCE + module_name[len("cadence") :]].items():
            value = getattr(module, name, None)
            if recorded["kind"] == "constant" or inspect.ismodule(value):
                continue
            if inspect.isclass(value):
                if issubclass(value, BaseException) or issubclass(value, enum.Enum):
                    continue  # exceptions and enums take no parameters of ours to describe
                add(value)
                for klass in value.__mro__:
                    if not klass.__module__.startswith("cadence"):
                        continue
                    for member_name, member in vars(klass).items():
                        if member_name.startswith("_"):
                            continue
                        member = getattr(member, "__func__", member)  # class/static methods
                        if inspect.isfunction(member):
                            add(member)
            elif inspect.isfunction(value) or inspect.isclass(type(value)) and callable(value):
                add(inspect.unwrap(value) if inspect.isfunction(value) else value)
    return {key: value for key, value in found.items() if callable(value)}


def described_names(doc: str) -> set[str]:
    """The names described in the parameter sections of a Google-style docstring."""
    names: set[str] = set()
    section_indent = None
    for line in inspect.cleandoc(doc).splitlines():
        heading = SECTION.match(line)
        if heading:
            title = heading["title"] + ":"
            section_indent = len(heading["indent"]) if title in PARAMETER_SECTIONS else None
            continue
        if section_indent is None or not line.strip():
            continue
        indent = len(line) - len(line.lstrip())
        if indent <= section_indent:
            section_indent = None  # the section ended
            continue
        entry = DESCRIBED.match(line)
        if entry and indent <= section_indent + 4:
            names.add(entry["name"].lstrip("*"))
    return names


def undescribed_parameters(value: object) -> list[str]:
    """The parameters `value` takes that its docstring does not describe."""
    try:
        signature = inspect.signature(value)
    except (TypeError, ValueError):
        return []
    if inspect.isclass(value):  # the class's docstring, or its own __init__'s
        owner = next(klass for klass in value.__mro__ if "__init__" in vars(klass))
        if not owner.__module__.startswith("cadence"):
            return []  # built by a base of torch or the standard library, documented there
        init = value.__dict__.get("__init__")
        docs = [own_docstring(value), getattr(init, "__doc__", None) or ""]
    else:
        docs = [inspect.getdoc(value) or ""]
    described = set().union(*(described_names(doc) for doc in docs))
    return [
        name
        for name in signature.parameters
        # a parameter named with an underscore is private: not part of the documented API
        if name not in ("self", "cls") and not name.startswith("_") and name not in described
    ]


def test_every_public_callable_describes_its_parameters() -> None:
    listed = set(UNDESCRIBED.read_text().split())
    callables = public_callables()
    missing, complete = [], []
    for key, value in sorted(callables.items()):
        gaps = undescribed_parameters(value)
        if gaps and key not in listed:
            missing.append(f"{key}: {', '.join(gaps)}")
        elif not gaps and key in listed:
            complete.append(key)
    gone = sorted(listed - set(callables))
    assert not missing, "parameters without a description (Args:): " + "; ".join(missing)
    assert not complete, f"now complete, remove from {UNDESCRIBED.name}: " + ", ".join(complete)
    assert not gone, f"no longer public, remove from {UNDESCRIBED.name}: " + ", ".join(gone)


def test_the_most_read_names_are_complete() -> None:
    """The Accelerator and the names a new user reaches first describe every parameter."""
    listed = set(UNDESCRIBED.read_text().split())
    must = [key for key in public_callables() if key.startswith(MOST_READ)]
    assert must and not sorted(set(must) & listed)


MOST_READ = (  # `module:Qualname` prefixes
    "cadence.accelerator.facade:Accelerator",
    "cadence.accelerator.checkpoint_methods:CheckpointMethods",
    "cadence.accelerator.state_attributes:StateAttributes",
    "cadence.accelerator.training_loop_methods:TrainingLoopMethods",
    "cadence.accelerator.model_methods:ModelMethods",
    "cadence.accelerator.process_methods:ProcessMethods",
    "cadence.accelerator.tracking_methods:TrackingMethods",
    "cadence.runtime.state:PartialState",
    "cadence.runtime.execution_control:ExecutionControl",
    "cadence.runtime.state:AcceleratorState",
    "cadence.runtime.gradient_state:GradientState",
    "cadence.bigmodel.empty_init:init_empty_weights",
    "cadence.bigmodel.dispatch:load_checkpoint_and_dispatch",
)


def docstring_examples() -> list[str]:
    """`module:Qualname` of every public callable (and property) whose docstring has doctest lines."""
    found = []
    for key, value in public_callables().items():
        if ">>>" in (inspect.getdoc(value) or ""):
            found.append(key)
        if inspect.isclass(value):
            for name, member in vars(value).items():
                if isinstance(member, property) and ">>>" in (member.__doc__ or ""):
                    found.append(f"{key}.{name}")
    return sorted(found)


# Runs the docstring examples named on its command line, each in an empty folder with its module's
# names (as doctest does), with the process state forgotten between them (each example starts its own
# Accelerator), and prints the failures. An example that needs a GPU or a download says
# `# doctest: +SKIP` on those lines.
DOCTEST_RUNNER = r"""
import doctest, importlib, io, os, sys, tempfile, warnings
from cadence.state import reset_state
warnings.simplefilter("ignore")
# DeepSpeed, imported by the unwrapping helpers, prints on stdout when it has to guess its device.
os.environ.setdefault("DS_ACCELERATOR", "cpu")
failed = 0
for key in sys.argv[1:]:
    module, _, qualname = key.partition(":")
    value = importlib.import_module(module)
    for part in qualname.split("."):
        value = getattr(value, part)
    doc = value.__doc__ or ""
    globs = dict(vars(importlib.import_module(module)))  # as doctest does: the module's names
    test = doctest.DocTestParser().get_doctest(doc, globs, key, module, 0)
    report = io.StringIO()
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    home, environment = os.getcwd(), dict(os.environ)
    with tempfile.TemporaryDirectory() as folder:
        os.chdir(folder)
        try:
            result = runner.run(test, out=report.write)
        finally:
            os.chdir(home)
            os.environ.clear()
            os.environ.update(environment)
            reset_state(destroy_process_group=True)
    if result.failed:
        failed += 1
        print(report.getvalue())
sys.exit(1 if failed else 0)
"""


def test_the_docstrings_have_examples() -> None:
    keys = docstring_examples()
    for key in (
        "facade:Accelerator.prepare",
        "training_loop_methods:TrainingLoopMethods.accumulate",
        "training_loop_methods:TrainingLoopMethods.backward",
        "process_methods:ProcessMethods.gather_for_metrics",
        "process_methods:ProcessMethods.main_process_first",
        "checkpoint_methods:CheckpointMethods.save_state",
    ):
        assert f"cadence.accelerator.{key}" in keys, key


@pytest.mark.parametrize("half", [0, 1])
def test_docstring_examples_run(tmp_path, half: int) -> None:
    """The `>>>` examples of the docstrings, in two processes (half of them each) on CPU."""
    keys = docstring_examples()[half::2]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CADENCE_", "ACCELERATE_"))}
    env.update(CUDA_VISIBLE_DEVICES="", HF_HOME=str(tmp_path / "hf"), TMPDIR=str(tmp_path))
    done = subprocess.run(
        [sys.executable, "-c", DOCTEST_RUNNER, *keys],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=EXAMPLE_TIMEOUT_S,
    )
    assert done.returncode == 0, (done.stdout[-6000:], done.stderr[-3000:])


if __name__ == "__main__":
    # `python tests/test_docs.py --write-undescribed` rewrites the ratchet list from the code (after a
    # merge moved or added public callables); review the diff: it should only shrink.
    if sys.argv[1:] != ["--write-undescribed"]:
        raise SystemExit("usage: python tests/test_docs.py --write-undescribed")
    gaps = sorted(key for key, value in public_callables().items() if undescribed_parameters(value))
    UNDESCRIBED.write_text("".join(f"{key}\n" for key in gaps))
    print(f"{UNDESCRIBED}: {len(gaps)} callables with undescribed parameters")
