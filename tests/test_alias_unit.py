"""The opt-in `accelerate` alias itself (CADENCE_AS_ACCELERATE=1), each case in a fresh interpreter:
module identity, mock.patch, metadata, find_spec, what pip sees, the `.pth` startup hook, the alias
off, `cadence.as_accelerate()` and `cadence launch --as-accelerate`; and the reference's submodules as
attributes of `cadence` / `cadence.utils`."""

from __future__ import annotations

import ast
import subprocess
import sys
import textwrap
from pathlib import Path

from alias_support import CADENCE, CASES, alias_env, result_of, run_python

ROOT = Path(__file__).resolve().parents[1]

# Where the wheel's hook is not installed (a source checkout on PYTHONPATH), do what it does.
PRELUDE = f"import sys; sys.path.insert(0, {str(CASES)!r}); from common import ensure_alias; ensure_alias()\n"


def test_accelerate_paths_are_the_cadence_module_objects(tmp_path):
    code = PRELUDE + textwrap.dedent(
        """
        import importlib, importlib.metadata, importlib.util, json
        from unittest import mock
        out = {"spec": importlib.util.find_spec("accelerate") is not None}
        out["version"] = importlib.metadata.version("accelerate")
        out["dist_name"] = importlib.metadata.distribution("accelerate").metadata["Name"]
        import accelerate, accelerate.state, accelerate.utils.dataclasses
        import cadence, cadence.state, cadence.utils.dataclasses
        from accelerate import Accelerator
        from accelerate.utils import gather
        out["version_attr"] = accelerate.__version__
        out["state_module"] = accelerate.state is cadence.state
        out["partial_state"] = accelerate.state.PartialState is cadence.state.PartialState
        out["dataclasses"] = accelerate.utils.dataclasses is cadence.utils.dataclasses
        out["accelerator"] = Accelerator is cadence.Accelerator
        out["gather"] = gather is cadence.utils.gather
        out["own_spec"] = cadence.state.__spec__.name
        with mock.patch("accelerate.utils.operations.gather") as patched:
            import cadence.utils.operations
            out["mock"] = cadence.utils.operations.gather is patched
        try:
            importlib.import_module("accelerate.no_such_module")
            out["missing"] = None
        except ModuleNotFoundError as error:
            out["missing"] = error.name
        # pip lists site-packages folders by path: the alias is not among what it finds
        listed = importlib.metadata.distributions(path=sys.path)
        out["by_path"] = [type(d).__name__ for d in listed if type(d).__name__ == "AliasDistribution"]
        print("RESULT " + json.dumps(out))
        """
    )
    out = run_python(tmp_path, code)
    assert out == {
        "spec": True,
        "version": "1.15.0",
        "dist_name": "accelerate",
        "version_attr": "1.15.0",
        "state_module": True,
        "partial_state": True,
        "dataclasses": True,
        "accelerator": True,
        "gather": True,
        "own_spec": "cadence.state",
        "mock": True,
        "missing": "accelerate.no_such_module",
        "by_path": [],
    }


def test_transformers_finds_accelerate(tmp_path):
    import pytest

    pytest.importorskip("transformers")
    code = PRELUDE + textwrap.dedent(
        """
        import json
        from transformers.utils import import_utils
        out = {"available": import_utils.is_accelerate_available(),
               "min_version": import_utils.is_accelerate_available("1.1.0")}
        print("RESULT " + json.dumps(out))
        """
    )
    assert run_python(tmp_path, code) == {"available": True, "min_version": True}


def _pip_list(tmp_path: Path, alias: bool) -> list:
    # pip run in a process where the alias is installed (as the startup hook would do)
    code = (PRELUDE if alias else "") + textwrap.dedent(
        """
        import contextlib, io, json, runpy, sys
        sys.argv = ["pip", "list", "--format=json", "--disable-pip-version-check"]
        buffer = io.StringIO()
        with contextlib.redirect_stdout(buffer):
            try:
                runpy.run_module("pip", run_name="__main__")
            except SystemExit:
                pass
        print("RESULT " + json.dumps(json.loads(buffer.getvalue())))
        """
    )
    listed = run_python(tmp_path, code, alias=alias)
    return sorted((p["name"].lower(), p["version"]) for p in listed)


def test_pip_sees_the_same_packages_with_the_alias_on(tmp_path):
    assert _pip_list(tmp_path, alias=True) == _pip_list(tmp_path, alias=False)


def _hook_from_setup() -> tuple[str, str]:
    """The `.pth` file name and line that setup.py ships in the wheel."""
    tree = ast.parse((ROOT / "setup.py").read_text())
    values = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name):
            if node.targets[0].id in ("PTH_NAME", "PTH_LINE"):
                values[node.targets[0].id] = ast.literal_eval(node.value)
    return values["PTH_NAME"], values["PTH_LINE"]


def test_startup_hook_imports_nothing_when_off_and_installs_the_alias_when_on(tmp_path):
    name, line = _hook_from_setup()
    # processed after an editable install's own .pth, which puts the source folder on sys.path
    assert name > "__editable__.cadence-0.1.0.pth"
    site_dir = tmp_path / "site"
    site_dir.mkdir()
    (site_dir / name).write_text(line)
    code = textwrap.dedent(
        f"""
        import json, site, sys
        site.addsitedir({str(site_dir)!r})
        out = {{"cadence": sorted(m for m in sys.modules if m.startswith("cadence")),
               "finder": any(type(f).__name__ == "AccelerateAliasFinder" for f in sys.meta_path)}}
        if out["finder"]:
            import accelerate.state, cadence.state
            out["same"] = accelerate.state is cadence.state
        print("RESULT " + json.dumps(out))
        """
    )
    off = run_python(tmp_path, code, alias=False)
    assert off == {"cadence": [], "finder": False}
    on = run_python(tmp_path, code, alias=True)
    assert on["finder"] is True and on["same"] is True


def test_alias_off_leaves_accelerate_alone(tmp_path):
    code = textwrap.dedent(
        """
        import importlib.machinery, json, sys
        import cadence, cadence.state  # importing Cadence alone installs nothing
        out = {"reference_installed": importlib.machinery.PathFinder.find_spec("accelerate") is not None,
               "finders": [type(f).__name__ for f in sys.meta_path if "Alias" in type(f).__name__]}
        if not out["reference_installed"]:
            try:
                import accelerate
                out["error"] = None
            except ModuleNotFoundError as error:
                out["error"] = error.name
        print("RESULT " + json.dumps(out))
        """
    )
    out = run_python(tmp_path, code, alias=False)
    assert out["finders"] == []
    if not out["reference_installed"]:  # as without the reference: the name is not found
        assert out["error"] == "accelerate"


def test_as_accelerate_turns_the_alias_on_here_and_in_child_processes(tmp_path):
    code = textwrap.dedent(
        """
        import json, subprocess, sys, warnings
        import cadence
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            cadence.as_accelerate()
        import accelerate.state, cadence.state
        child = subprocess.run([sys.executable, "-c", "import os; print(os.environ['CADENCE_AS_ACCELERATE'])"],
                               capture_output=True, text=True, check=True)
        out = {"same": accelerate.state is cadence.state, "child": child.stdout.strip(),
               "warnings": [str(w.message) for w in caught]}
        print("RESULT " + json.dumps(out))
        """
    )
    assert run_python(tmp_path, code, alias=False) == {"same": True, "child": "1", "warnings": []}


def test_as_accelerate_after_transformers_warns(tmp_path):
    import pytest

    pytest.importorskip("transformers")
    code = textwrap.dedent(
        """
        import json, warnings
        import transformers, cadence
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            cadence.as_accelerate()
        print("RESULT " + json.dumps([str(w.message) for w in caught]))
        """
    )
    messages = run_python(tmp_path, code, alias=False)
    assert any("after transformers" in m for m in messages)


def test_launch_as_accelerate_turns_the_alias_on_in_every_worker(tmp_path):
    script = tmp_path / "worker.py"
    script.write_text(
        textwrap.dedent(
            """
            import os
            import accelerate.state, cadence.state
            state = accelerate.state.PartialState(cpu=True)
            print(f"rank {state.process_index} same={accelerate.state is cadence.state} "
                  f"env={os.environ['CADENCE_AS_ACCELERATE']}", flush=True)
            """
        )
    )
    completed = subprocess.run(
        [*CADENCE, "launch", "--cpu", "--num_processes", "2", "--as-accelerate", str(script)],
        cwd=tmp_path,
        env=alias_env(tmp_path, alias=False),
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    lines = sorted(x for x in completed.stdout.splitlines() if x.startswith("rank "))
    assert lines == ["rank 0 same=True env=1", "rank 1 same=True env=1"]


# The reference's package submodules (accelerate 1.15.0), reached as attributes once imported.
TOP_LEVEL = [
    "accelerator", "big_modeling", "checkpointing", "commands", "data_loader", "hooks", "inference",
    "launchers", "local_sgd", "logging", "memory_utils", "optimizer", "parallelism_config",
    "scheduler", "state", "test_utils", "tracking", "utils",
]  # fmt: skip
UTILS = [
    "ao", "bnb", "constants", "dataclasses", "deepspeed", "environment", "fsdp_utils", "imports",
    "launch", "megatron_lm", "memory", "modeling", "offload", "operations", "other", "random", "rich",
    "torch_xla", "transformer_engine", "versions",
]  # fmt: skip


def test_submodules_are_attributes_and_import_cadence_stays_lazy(tmp_path):
    code = textwrap.dedent(
        f"""
        import json, sys, types, warnings
        warnings.simplefilter("ignore")
        import cadence, cadence.utils
        out = {{"loaded_by_import": sorted(n for n in {TOP_LEVEL!r} if "cadence." + n in sys.modules
                                           and n != "utils"),
               "torch": "torch" in sys.modules}}
        out["top"] = [n for n in {TOP_LEVEL!r}
                      if getattr(cadence, n) is not sys.modules["cadence." + n]]
        out["utils"] = [n for n in {UTILS!r}
                        if getattr(cadence.utils, n) is not sys.modules["cadence.utils." + n]]
        out["dir"] = set({TOP_LEVEL!r}) <= set(dir(cadence))
        print("RESULT " + json.dumps(out))
        """
    )
    out = run_python(tmp_path, code, alias=False)
    assert out == {"loaded_by_import": [], "torch": False, "top": [], "utils": [], "dir": True}


def test_result_of_reports_a_failed_script(tmp_path):
    completed = subprocess.run(
        [sys.executable, "-c", "raise SystemExit('boom')"], capture_output=True, text=True
    )
    try:
        result_of(completed)
    except AssertionError as error:
        assert "boom" in str(error)
    else:
        raise AssertionError("result_of accepted output without a RESULT line")
