"""Generate the API and CLI reference pages of the documentation site.

mkdocs-gen-files runs this file at build time (see mkdocs.yml): one page per public module of
tests/data/reference_surface.json (the reference's module paths, `accelerate` -> `cadence`) and one
page for the `cadence` command, built from `cadence.commands.cli.build_parser()`. Nothing generated is
committed, so the reference follows the code.

Each public object is documented in full once, at its shortest public path (`cadence.Accelerator`
before `cadence.accelerator.Accelerator`; `cadence.utils.gather` before
`cadence.utils.operations.gather`); its other public paths list it with a link there. mkdocstrings reads
the object at the module that defines it, found by importing the public name, so the pages do not
depend on where Cadence keeps its own modules.

Run directly (`python docs/gen_pages.py`) it prints the pages it would write, for a quick look.
"""

from __future__ import annotations

import argparse
import enum
import importlib
import inspect
import json
import re
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the helper beside this file
from griffe_examples import say_accelerate  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
SURFACE = ROOT / "tests" / "data" / "reference_surface.json"
REFERENCE_DIR = "reference"


@dataclass(frozen=True)
class Entry:
    """One public name at one public path."""

    module: str  # the public module, e.g. "cadence.utils"
    name: str  # the name in that module
    kind: str  # "class", "function", "enum", "constant" (the reference's kind), or "module"
    home: str | None  # where mkdocstrings reads it ("pkg.mod.Qual"); None for constants and modules

    @property
    def path(self) -> str:
        """The public dotted path, e.g. `cadence.utils.gather`."""
        return f"{self.module}.{self.name}"


def public_modules() -> dict[str, dict[str, dict]]:
    """The public module paths (`cadence...`) and their recorded names, from the surface file."""
    data = json.loads(SURFACE.read_text())
    prefix = data["reference"]
    modules = {"cadence" + path[len(prefix) :]: names for path, names in data["modules"].items()}
    for path in data["unimportable_modules"]:
        modules.setdefault("cadence" + path[len(prefix) :], {})
    return dict(sorted(modules.items()))


def home_of(value: object) -> str | None:
    """Where the object is defined, as a dotted path griffe can load; None when it has none."""
    module = getattr(value, "__module__", None)
    qualname = getattr(value, "__qualname__", None)
    if not module or not qualname or "<" in qualname or not module.startswith("cadence"):
        return None
    return f"{module}.{qualname}"


def import_quietly(module: str) -> object | None:
    """Import a public module without its deprecation warnings; None when it needs a missing package."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            return importlib.import_module(module)
        except ImportError:
            return None


def entries() -> dict[str, list[Entry]]:
    """Every public module's entries, importing each public name (in this interpreter)."""
    out: dict[str, list[Entry]] = {}
    for module, names in public_modules().items():
        imported = import_quietly(module)
        rows = []
        for name, recorded in sorted(names.items()):
            value = getattr(imported, name, None) if imported is not None else None
            kind = recorded["kind"]
            if inspect.ismodule(value):
                kind = "module"
            home = None if kind in ("constant", "module") else home_of(value)
            rows.append(Entry(module, name, kind, home))
        out[module] = rows
    return out


def primary_paths(all_entries: dict[str, list[Entry]]) -> dict[str, str]:
    """Each documented object's home -> the public path its full documentation is shown at."""
    best: dict[str, str] = {}
    for rows in all_entries.values():
        for entry in rows:
            if entry.home is None:
                continue
            current = best.get(entry.home)
            key = (entry.path.count("."), entry.path)
            if current is None or key < (current.count("."), current):
                best[entry.home] = entry.path
    return best


def page_of(module: str) -> str:
    """The generated page of a public module, relative to the docs folder."""
    return f"{REFERENCE_DIR}/{module}.md"


def summary(obj: object) -> str:
    """The first paragraph of an object's docstring on one line, Accelerate named as such (empty
    without a docstring)."""
    doc = (inspect.getdoc(obj) or "").strip()
    return say_accelerate(" ".join(doc.split("\n\n")[0].split())) if doc else ""


def constant_repr(value: object) -> str:
    """A short, one-line representation for a table cell."""
    text = repr(value)
    if isinstance(value, enum.Enum):
        text = f"{type(value).__name__}.{value.name}"
    text = text.replace("|", "\\|").replace("\n", " ")
    return text if len(text) <= 90 else text[:87] + "..."


def anchor(entry: Entry) -> str:
    """An HTML anchor named for the public path, so `page#cadence.utils.gather` links to the name."""
    return f'<a id="{entry.path}"></a>'


def has_method_mixins(imported: object, row: Entry, primary: dict[str, str]) -> bool:
    """Whether the class takes methods from Cadence base classes that are not public themselves (the
    Accelerator's methods live in such bases, one per concern): its page then shows them."""
    value = getattr(imported, row.name, None)
    if not inspect.isclass(value):
        return False
    return any(
        base.__module__.startswith("cadence.") and home_of(base) not in primary
        for base in value.__bases__
    )


def module_page(module: str, rows: list[Entry], primary: dict[str, str]) -> str:
    """The Markdown of one public module's page."""
    imported = import_quietly(module)
    lines = [f"# `{module}`", ""]
    doc = inspect.getdoc(imported) if imported is not None else None
    if imported is None:
        lines += [
            "This module needs an optional package that is not installed where the site was built.",
            "",
        ]
    elif doc:
        lines += [user_summary(module, imported), ""]
    if not rows:
        lines += [
            "This module holds no public names of its own (it exists for its import path).",
            "",
        ]
        return "\n".join(lines)
    documented = [row for row in rows if row.home and primary.get(row.home) == row.path]
    elsewhere = [row for row in rows if row.home and primary.get(row.home) != row.path]
    constants = [row for row in rows if row.kind == "constant"]
    others = [row for row in rows if row.home is None and row.kind != "constant"]
    for row in documented:
        lines += [
            anchor(row),
            "",
            f"::: {row.home}",
            "    options:",
            "      show_root_heading: true",
            "      show_root_full_path: false",
            "      heading_level: 2",
            *(
                ["      inherited_members: true"]
                if has_method_mixins(imported, row, primary)
                else []
            ),
            "",
        ]
    if elsewhere:
        lines += [
            "## Also importable here",
            "",
            "| name | documented at |",
            "| --- | --- |",
        ]
        for row in elsewhere:
            target = primary[row.home]
            lines.append(f"| {anchor(row)}`{row.name}` | [`{target}`][{row.home}] |")
        lines.append("")
    if constants:
        lines += ["## Constants", "", "| name | value |", "| --- | --- |"]
        for row in constants:
            value = getattr(imported, row.name, None)
            lines.append(f"| {anchor(row)}`{row.name}` | `{constant_repr(value)}` |")
        lines.append("")
    if others:
        lines += ["## Other names", "", "| name | what it is |", "| --- | --- |"]
        for row in others:
            value = getattr(imported, row.name, None) if imported is not None else None
            what = summary(value) or f"`{type(value).__name__}`"
            lines.append(f"| {anchor(row)}`{row.name}` | {what} |")
        lines.append("")
    return "\n".join(lines)


# The reference's front page, by the questions users bring: (title, what the section answers, public
# paths). Each path must be public (the build fails otherwise); its full documentation is linked.
GROUPS: list[tuple[str, str, list[str]]] = [
    (
        "The Accelerator",
        "The object a training script creates: it prepares models, optimizers, schedulers and "
        "dataloaders, runs backward and gradient accumulation, gathers, saves and loads.",
        ["cadence.Accelerator"],
    ),
    (
        "State",
        "Which process this is, how many there are, on which device, and whether this micro-step "
        "synchronises gradients; usable without an Accelerator.",
        ["cadence.PartialState", "cadence.state.AcceleratorState", "cadence.state.GradientState"],
    ),
    (
        "Configuration and plugins",
        "Settings passed to the Accelerator: dataloaders, project layout, accumulation, sharding "
        "(FSDP, DeepSpeed, parallelism sizes), compilation and the handlers that tune DDP, the "
        "process group, autocast, the profiler and fp8.",
        [
            "cadence.DataLoaderConfiguration",
            "cadence.utils.ProjectConfiguration",
            "cadence.utils.GradientAccumulationPlugin",
            "cadence.ParallelismConfig",
            "cadence.FullyShardedDataParallelPlugin",
            "cadence.DeepSpeedPlugin",
            "cadence.utils.TorchDynamoPlugin",
            "cadence.utils.TorchTensorParallelPlugin",
            "cadence.utils.MegatronLMPlugin",
            "cadence.DistributedDataParallelKwargs",
            "cadence.InitProcessGroupKwargs",
            "cadence.GradScalerKwargs",
            "cadence.AutocastKwargs",
            "cadence.ProfileKwargs",
            "cadence.utils.FP8RecipeKwargs",
            "cadence.utils.AORecipeKwargs",
            "cadence.utils.TERecipeKwargs",
            "cadence.utils.KwargsHandler",
            "cadence.DistributedType",
        ],
    ),
    (
        "Launchers and the command line",
        "Starting several processes from a notebook or a test; the `cadence` command itself is on "
        "its own page.",
        ["cadence.notebook_launcher", "cadence.debug_launcher"],
    ),
    (
        "Data",
        "What `prepare()` makes of a DataLoader, and resuming in the middle of an epoch.",
        [
            "cadence.skip_first_batches",
            "cadence.data_loader.prepare_data_loader",
            "cadence.data_loader.DataLoaderShard",
            "cadence.data_loader.DataLoaderDispatcher",
            "cadence.data_loader.SeedableRandomSampler",
        ],
    ),
    (
        "Checkpoints",
        "The Accelerator's `save_state`, `load_state`, `save_model` and `register_for_checkpointing` "
        "do most of the work (see the Accelerator); these save and load single objects and merge "
        "sharded FSDP checkpoints.",
        [
            "cadence.checkpointing.save_custom_state",
            "cadence.checkpointing.load_custom_state",
            "cadence.utils.save",
            "cadence.utils.load",
            "cadence.utils.merge_fsdp_weights",
        ],
    ),
    (
        "Trackers and logging",
        "Experiment trackers for `log_with=`, writing your own, and logging once per job.",
        [
            "cadence.tracking.GeneralTracker",
            "cadence.tracking.TensorBoardTracker",
            "cadence.tracking.WandBTracker",
            "cadence.tracking.MLflowTracker",
            "cadence.logging.get_logger",
        ],
    ),
    (
        "Big models",
        "Building a model without memory, loading it over GPUs, CPU and disk, offloading, and "
        "pipeline-parallel inference.",
        [
            "cadence.init_empty_weights",
            "cadence.init_on_device",
            "cadence.load_checkpoint_and_dispatch",
            "cadence.load_checkpoint_in_model",
            "cadence.dispatch_model",
            "cadence.infer_auto_device_map",
            "cadence.cpu_offload",
            "cadence.cpu_offload_with_hook",
            "cadence.disk_offload",
            "cadence.prepare_pippy",
        ],
    ),
    (
        "Utilities",
        "Seeding, collectives outside the Accelerator, memory helpers and the local-SGD wrapper.",
        [
            "cadence.find_executable_batch_size",
            "cadence.utils.set_seed",
            "cadence.synchronize_rng_states",
            "cadence.utils.gather",
            "cadence.utils.gather_object",
            "cadence.utils.broadcast",
            "cadence.utils.reduce",
            "cadence.utils.pad_across_processes",
            "cadence.utils.release_memory",
            "cadence.utils.patch_environment",
            "cadence.local_sgd.LocalSGD",
        ],
    ),
]


def user_summary(module: str, imported: object) -> str:
    """What a module holds, for users: a re-exported path is described by the module it re-exports."""
    if imported is None:
        return "(needs an optional package)"
    found = re.match(
        r"Reference path: re-exports `([\w.]+)`(?: \(([^)]*)\))?", inspect.getdoc(imported) or ""
    )
    if found:  # say what it holds: the re-export's own words, else the home module's summary
        what = (
            found[2][0].upper() + found[2][1:] + "."
            if found[2]
            else summary(import_quietly(found[1]))
        )
        return f"Accelerate's path `accelerate{module[len('cadence') :]}`. {what}"
    return summary(imported)


def index_page(all_entries: dict[str, list[Entry]]) -> str:
    """The reference's front page: the names users look for, grouped by question, then every
    public module with what it holds."""
    public = {entry.path: entry for rows in all_entries.values() for entry in rows}
    lines = [
        "# API reference",
        "",
        "The names most scripts use, grouped by what you want to do; each links to its full "
        "documentation (parameters, what is refused, examples). Every public name is importable at "
        "Accelerate's module path with `accelerate` changed to `cadence`: the last section lists "
        "every module. The `cadence` command is described in the [command-line reference](../cli.md).",
        "",
    ]
    for title, about, paths in GROUPS:
        lines += [f"## {title}", "", about, "", "| name | what it is |", "| --- | --- |"]
        for path in paths:
            entry = public.get(path)
            if entry is None:
                raise ValueError(f"the reference index names {path}, which is not public")
            value = getattr(import_quietly(entry.module), entry.name, None)
            what = summary(value).replace("|", chr(92) + "|")
            lines.append(f"| [`{path}`]({entry.module}.md#{path}) | {what} |")
        lines.append("")
    lines += [
        "## Every module path",
        "",
        "| module | names | what it holds |",
        "| --- | --- | --- |",
    ]
    for module, rows in all_entries.items():
        first = user_summary(module, import_quietly(module))
        lines.append(
            f"| [`{module}`]({module}.md) | {len(rows)} | {first.replace('|', chr(92) + '|')} |"
        )
    lines.append("")
    return "\n".join(lines)


# --- the command line ------------------------------------------------------------------------------


def subcommands(parser: argparse.ArgumentParser) -> list[tuple[str, str, argparse.ArgumentParser]]:
    """(name, one-line help, parser) of each subcommand of `parser`, in registration order."""
    found = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {choice.dest: choice.help or "" for choice in action._choices_actions}
            seen = set()
            for name, sub in action.choices.items():
                if id(sub) in seen:  # an alias of a command already listed
                    continue
                seen.add(id(sub))
                found.append((name, helps.get(name, ""), sub))
    return found


def argument_rows(parser: argparse.ArgumentParser) -> list[tuple[str, list[argparse.Action]]]:
    """The parser's argument groups (title, actions), without help actions and subcommands."""
    groups = []
    for group in parser._action_groups:
        actions = [
            action
            for action in group._group_actions
            if not isinstance(action, argparse._HelpAction | argparse._SubParsersAction)
            and action.help != argparse.SUPPRESS
        ]
        if actions:
            groups.append((group.title or "arguments", actions))
    return groups


def cell(text: str) -> str:
    """Text made safe for a Markdown table cell."""
    return say_accelerate(" ".join(str(text).split())).replace("|", "\\|")


def command_section(
    prefix: str, help_line: str, parser: argparse.ArgumentParser, level: int
) -> list[str]:
    """The Markdown of one command, then of its subcommands."""
    lines = [f"{'#' * level} `{prefix}`", ""]
    if parser.description:
        lines += [cell(parser.description), ""]
    elif help_line:
        lines += [cell(help_line), ""]
    lines += ["```text", parser.format_usage().strip(), "```", ""]
    for title, actions in argument_rows(parser):
        lines += [f"**{cell(title)}**", "", "| argument | meaning |", "| --- | --- |"]
        for action in actions:
            names = ", ".join(f"`{name}`" for name in action.option_strings) or f"`{action.dest}`"
            meaning = cell(action.help or "")
            if action.choices and not isinstance(action.choices, dict):
                meaning += (
                    " Choices: " + ", ".join(f"`{choice}`" for choice in action.choices) + "."
                )
            lines.append(f"| {names} | {meaning} |")
        lines.append("")
    for name, sub_help, sub in subcommands(parser):
        lines += command_section(f"{prefix} {name}", sub_help, sub, min(level + 1, 4))
    return lines


def cli_page() -> str:
    """The CLI reference: every command, its usage and its arguments, from the parser itself."""
    from cadence.commands.cli import build_parser

    parser = build_parser()
    lines = [
        "# Command-line reference",
        "",
        "Generated from the `cadence` command's own parser at build time; `cadence <command> --help` "
        "prints the same. Every flag also has the spelling with dashes (`--num-processes`).",
        "",
        "| command | what it does |",
        "| --- | --- |",
    ]
    for name, help_line, _ in subcommands(parser):
        lines.append(f"| `cadence {name}` | {cell(help_line)} |")
    lines.append("")
    for name, help_line, sub in subcommands(parser):
        lines += command_section(f"cadence {name}", help_line, sub, 2)
    return "\n".join(lines)


def pages() -> dict[str, str]:
    """Every generated page: path relative to the docs folder -> Markdown."""
    all_entries = entries()
    primary = primary_paths(all_entries)
    out = {f"{REFERENCE_DIR}/index.md": index_page(all_entries)}
    for module, rows in all_entries.items():
        out[page_of(module)] = module_page(module, rows, primary)
    out["cli.md"] = cli_page()
    return out


def write_with_gen_files() -> None:
    """Write the pages into the site being built (called by mkdocs-gen-files)."""
    import mkdocs_gen_files

    for path, text in pages().items():
        with mkdocs_gen_files.open(path, "w") as handle:
            handle.write(text)


if __name__ == "<run_path>":  # mkdocs-gen-files runs the file with runpy.run_path
    write_with_gen_files()
elif __name__ == "__main__":
    for path, text in pages().items():
        print(f"{path}: {len(text.splitlines())} lines")
