"""The torch compatibility table (core/torch_compat.py) covers every private torch name the package
touches, and the release switches refuse where torch is wrong (issue 33).

The scan reads the package's source (ast): private torch modules and names imported, private
attributes reached from a torch import (`dist.distributed_c10d._get_default_group`), private members
of torch classes that Cadence subclasses (overridden or used through `self`/`super()`), and private
attribute names Cadence reads on objects it did not create (`handler._op_executor`, getattr/hasattr
with a literal name) that Cadence does not define itself. Each must be a row of the table (or, for the
last kind, a name listed below as belonging to another library).
"""

from __future__ import annotations

import ast
import importlib
import inspect
import re
from pathlib import Path

import pytest

from cadence.core import torch_compat
from cadence.core.torch_compat import TORCH_APIS, TorchVersionError, refuse_before

PACKAGE = Path(torch_compat.__file__).resolve().parents[1]

# Private names Cadence reads that are not torch's: the library they belong to.
NOT_TORCH = {
    "_init_weights": "transformers (PreTrainedModel._init_weights, a pipeline stage's initializer)",
    "_ArgumentGroup": "argparse",
    "_SubParsersAction": "argparse",
    "_action_groups": "argparse",
    "_actions": "argparse",
    "_current_frames": "sys",
    "_getframe": "sys",
    "_fields": "namedtuple",
    "_register_atexit": "threading",
    "_shutdown": "threading (the worker's exit); torch's agent `_shutdown` is matched as a class member",
    "_run_exitfuncs": "atexit",
    "_core": "numpy",
    "_reconstruct": "numpy",
    "_no_split_modules": "transformers",
    "_tied_weights_keys": "transformers",
    "_tp_plan": "transformers",
    "_attn_implementation": "transformers (a model config's attention implementation)",
    "_zero3_consolidated_16bit_state_dict": "deepspeed",
    "_get_device_type": "habana_frameworks",
}


ATTR_LOOKUPS = ("getattr", "hasattr", "setattr", "delattr")


def _private(segment: str) -> bool:
    return segment.startswith("_") and not (segment.startswith("__") and segment.endswith("__"))


def _dotted(node: ast.AST) -> list[str] | None:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        return [node.id, *reversed(parts)]
    return None


def _through_private(parts: list[str]) -> str | None:
    for i, part in enumerate(parts):
        if i and _private(part):
            return ".".join(parts[: i + 1])
    return None


def _resolve(path: str):
    parts = path.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for part in parts[i:]:
            obj = getattr(obj, part, None)
        return obj
    return None


def _torch_source_of(cls: type) -> str:
    text = ""
    for klass in cls.__mro__:
        if klass.__module__.startswith("torch"):
            try:
                text += inspect.getsource(klass)
            except (OSError, TypeError):
                pass
    return text


def _defined_by_cadence(trees) -> set[str]:
    names = set()
    for tree in trees:
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                names.add(node.attr)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                names.add(node.id)
            elif isinstance(node, ast.arg):
                names.add(node.arg)
            elif isinstance(node, ast.alias):
                names.add(node.asname or node.name.split(".")[0])
    return names


def scan_private_torch_names() -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    """(qualified private torch names -> where, bare private attribute names -> where)."""
    trees = {path: ast.parse(path.read_text()) for path in sorted(PACKAGE.rglob("*.py"))}
    own = _defined_by_cadence(trees.values())
    qualified: dict[str, set[str]] = {}
    bare: dict[str, set[str]] = {}

    def add(table, name, path, node):
        table.setdefault(name, set()).add(f"{path.relative_to(PACKAGE)}:{node.lineno}")

    for path, tree in trees.items():
        alias: dict[str, str] = {}
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for item in node.names:
                    if item.name.split(".")[0] == "torch":
                        alias[item.asname or "torch"] = item.name if item.asname else "torch"
                        hit = _through_private(item.name.split("."))
                        if hit:
                            add(qualified, hit, path, node)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                if node.module.split(".")[0] != "torch":
                    continue
                hit = _through_private(node.module.split("."))
                if hit:
                    add(qualified, hit, path, node)
                for item in node.names:
                    alias[item.asname or item.name] = f"{node.module}.{item.name}"
                    if _private(item.name) and not hit:
                        add(qualified, f"{node.module}.{item.name}", path, node)
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute):
                parts = _dotted(node)
                if parts and parts[0] in alias:
                    root = alias[parts[0]].split(".")
                    hit = _through_private(root + parts[1:])
                    if hit and not _through_private(root):
                        add(qualified, hit, path, node)
                elif _private(node.attr) and node.attr not in own:
                    add(bare, node.attr, path, node)
            elif alias and isinstance(node, (ast.Call, ast.Tuple, ast.List)):
                # Attribute names as strings: getattr/hasattr(obj, "_name"), or a list of names.
                if isinstance(node, ast.Call):
                    is_lookup = isinstance(node.func, ast.Name) and node.func.id in ATTR_LOOKUPS
                    names = node.args[1:2] if is_lookup else []
                else:
                    names = node.elts
                for item in names:
                    if isinstance(item, ast.Constant) and isinstance(item.value, str):
                        text = item.value
                        if re.fullmatch(r"_[A-Za-z]\w*", text) and text not in own:
                            add(bare, text, path, item)
            elif isinstance(node, ast.ClassDef):
                for base_node in node.bases:
                    parts = _dotted(base_node)
                    if not parts or parts[0] not in alias:
                        continue
                    base_path = ".".join(alias[parts[0]].split(".") + parts[1:])
                    base = _resolve(base_path)
                    if not isinstance(base, type):
                        continue
                    source = _torch_source_of(base)
                    for sub in ast.walk(node):
                        name = None
                        if isinstance(sub, ast.FunctionDef) and sub in node.body:
                            name = sub.name
                        elif isinstance(sub, ast.Attribute):
                            value = sub.value
                            if (isinstance(value, ast.Name) and value.id == "self") or (
                                isinstance(value, ast.Call)
                                and isinstance(value.func, ast.Name)
                                and value.func.id == "super"
                            ):
                                name = sub.attr
                        if name and _private(name):
                            if hasattr(base, name) or re.search(rf"self\.{name}\b", source):
                                add(qualified, f"{base_path}.{name}", path, sub)
    return qualified, bare


def test_every_private_torch_name_is_in_the_compat_table():
    qualified, bare = scan_private_torch_names()
    declared = {row.name for row in TORCH_APIS}
    last_segments = {row.name.rsplit(".", 1)[-1] for row in TORCH_APIS}
    missing = {name: sorted(where) for name, where in qualified.items() if name not in declared}
    assert not missing, (
        "private torch names used without a row in core/torch_compat.py TORCH_APIS "
        f"(add one: since which release, the fallback): {missing}"
    )
    unknown = {
        name: sorted(where)
        for name, where in bare.items()
        if name not in last_segments and name not in NOT_TORCH
    }
    assert not unknown, (
        "private attributes read on objects Cadence did not create: add torch's to TORCH_APIS, "
        f"another library's to NOT_TORCH in this test: {unknown}"
    )
    # The scan sees what it must (so an empty result is not a broken scanner).
    assert "torch.distributed.distributed_c10d._get_default_group" in qualified
    assert any(name.endswith("LocalElasticAgent._shutdown") for name in qualified)
    assert "_op_executor" in bare


def test_every_row_names_a_release_and_a_fallback():
    for row in TORCH_APIS:
        assert re.fullmatch(r"\d+\.\d+", row.since), row
        assert row.fallback and row.used_by, row


def test_refusal_names_the_release_and_the_fix():
    with pytest.raises(TorchVersionError) as error:
        refuse_before("99.0", "Feature X on CPU/gloo", "it gives wrong numbers", "use a GPU")
    text = str(error.value)
    assert "torch >= 99.0" in text and "pip install 'torch>=99.0'" in text
    assert "use a GPU" in text and "Feature X" in text
    refuse_before(torch_compat.DECLARED_MINIMUM, "anything", "never")  # the floor: no refusal


def test_fsdp2_on_cpu_is_refused_where_torch_is_wrong(dist_pool):
    """On a release before FSDP2_ON_GLOO, preparing FSDP2 on CPU raises the refusal on every rank;
    from it on, it trains (test_fsdp.py checks the numbers)."""
    results = dist_pool(2).run(_prepare_fsdp2)
    refused = not torch_compat.torch_at_least(torch_compat.FSDP2_ON_GLOO)
    for outcome in results:
        if refused:
            # 2.6 stops at the one-process refusal (FSDP2_ON_CPU), 2.7 and 2.8 at the gloo one.
            assert outcome.startswith("refused: FSDP2 (fully_shard) on CPU"), outcome
            assert "needs torch >= " in outcome and "pip install 'torch>=" in outcome
        else:
            assert outcome == "prepared"


def test_fsdp2_on_one_cpu_process_is_refused_where_fully_shard_fails(dist_pool):
    """Before FSDP2_ON_CPU (2.6) fully_shard fails on CPU even on one process: refused there too."""
    (outcome,) = dist_pool(1).run(_prepare_fsdp2)
    if torch_compat.torch_at_least(torch_compat.FSDP2_ON_CPU):
        assert outcome == "prepared"
    else:
        assert outcome.startswith("refused: FSDP2 (fully_shard) on CPU needs torch >= 2.7; "), (
            outcome
        )


def _prepare_fsdp2() -> str:
    import torch

    from cadence import Accelerator
    from cadence.utils import FullyShardedDataParallelPlugin

    accelerator = Accelerator(cpu=True, fsdp_plugin=FullyShardedDataParallelPlugin(fsdp_version=2))
    try:
        accelerator.prepare(torch.nn.Linear(4, 2))
    except TorchVersionError as error:
        return f"refused: {error}"
    return "prepared"
