"""The documentation site: every public name has a docstring, the generated reference covers every
public name and command, and the code examples of the pages run.

The site itself is built by `make docs` (`mkdocs build --strict`, run by .ci/run), which fails on a
broken link or reference; these tests need no mkdocs.
"""

from __future__ import annotations

import argparse
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
    spec = importlib.util.spec_from_file_location("docs_gen_pages", DOCS / "gen_pages.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_the_generated_reference_shows_every_public_name_and_command() -> None:
    pages = load_generator().pages()
    for path, names in SURFACE["modules"].items():
        module = "cadence" + path[len(REFERENCE) :]
        page = pages[f"reference/{module}.md"]
        assert page.startswith(f"# `{module}`"), module
        for name in names:
            assert f'<a id="{module}.{name}"></a>' in page, f"{module}.{name} is not on its page"
    index = pages["reference/index.md"]
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
