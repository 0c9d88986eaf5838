"""cadence.test_utils: the helpers, the truthful skip decorators, the test-case bases, and the
bundled distributed scripts run for real through `cadence launch` on 2 CPU processes."""

from __future__ import annotations

import os
import sys
import unittest

import pytest
import torch

from cadence.test_utils import (
    DEFAULT_LAUNCH_COMMAND,
    AccelerateTestCase,
    RegressionDataset,
    RegressionModel,
    TempDirTestCase,
    assert_exception,
    capture_call_output,
    device_count,
    execute_subprocess_async,
    get_launch_command,
    path_in_accelerate_package,
    require_cpu,
    require_cuda,
    torch_device,
)
from cadence.test_utils.examples import clean_lines, get_function_contents_by_name
from cadence.test_utils.testing import (
    MockingTestCase,
    SubprocessCallException,
    parse_flag_from_env,
    require_deepspeed,
    run_command,
    slow,
)


def test_launch_command_and_backend_describe_this_machine():
    assert get_launch_command(num_processes=2, cpu=True, debug=False, other=None) == [
        "cadence",
        "launch",
        "--num_processes=2",
        "--cpu",
    ]
    expected_device = "cuda" if torch.cuda.is_available() else torch_device
    assert torch_device == expected_device
    assert device_count == (
        torch.cuda.device_count() if torch.cuda.is_available() else device_count
    )
    assert DEFAULT_LAUNCH_COMMAND[:3] == ["cadence", "launch", f"--num_processes={device_count}"]


def test_assert_exception_and_capture_call_output():
    with assert_exception(ValueError, "bad"):
        raise ValueError("bad input")
    with pytest.raises(AssertionError, match="ran without issue"):
        with assert_exception(ValueError):
            pass
    with pytest.raises(AssertionError, match="Expected message"):
        with assert_exception(ValueError, "other"):
            raise ValueError("bad input")
    assert capture_call_output(print, "hello") == "hello\n"


def test_parse_flag_from_env(monkeypatch):
    monkeypatch.setenv("CADENCE_T_RUN", "yes")
    assert parse_flag_from_env("CADENCE_T_RUN") == 1
    monkeypatch.setenv("CADENCE_T_RUN", "perhaps")
    with pytest.raises(ValueError, match="must be yes or no"):
        parse_flag_from_env("CADENCE_T_RUN")


def _run_case(case_class, method="test_it"):
    result = unittest.TestResult()
    case_class(method).run(result)
    return result


def test_skip_decorators_answer_for_this_machine():
    class Cases(unittest.TestCase):
        @require_cuda
        def test_cuda(self):
            pass

        @require_cpu
        def test_cpu(self):
            pass

        @require_deepspeed
        def test_deepspeed(self):
            pass

        @slow
        def test_slow(self):
            pass

    cuda = _run_case(Cases, "test_cuda")
    assert bool(cuda.skipped) == (not torch.cuda.is_available())
    cpu = _run_case(Cases, "test_cpu")
    assert bool(cpu.skipped) == (torch_device != "cpu")
    import importlib.util

    deepspeed = _run_case(Cases, "test_deepspeed")
    assert bool(deepspeed.skipped) == (importlib.util.find_spec("deepspeed") is None)
    slow_result = _run_case(Cases, "test_slow")
    assert bool(slow_result.skipped) == (
        os.environ.get("RUN_SLOW", "no").lower() not in ("1", "yes", "true", "y", "t", "on")
    )


def test_temp_dir_test_case_clears_between_tests():
    seen = []

    class Case(TempDirTestCase):
        def test_a(self):
            seen.append(sorted(p.name for p in self.tmpdir.iterdir()))
            (self.tmpdir / "file.txt").write_text("x")
            (self.tmpdir / "folder").mkdir()

        def test_b(self):
            seen.append(sorted(p.name for p in self.tmpdir.iterdir()))

    suite = unittest.TestSuite([Case("test_a"), Case("test_b")])
    result = unittest.TestResult()
    suite.run(result)
    assert result.wasSuccessful() and seen == [[], []]
    assert not Case.tmpdir.exists()


def test_accelerate_test_case_resets_state():
    from cadence import Accelerator
    from cadence.state import AcceleratorState

    class Case(AccelerateTestCase):
        def test_it(self):
            Accelerator(cpu=True)

    assert _run_case(Case).wasSuccessful()
    assert AcceleratorState._shared_state == {}


def test_mocking_test_case_stops_its_mocks():
    from unittest import mock

    class Case(MockingTestCase):
        def setUp(self):
            super().setUp()
            self.add_mocks(mock.patch.dict(os.environ, {"CADENCE_T_MOCKED": "1"}))

        def test_it(self):
            assert os.environ["CADENCE_T_MOCKED"] == "1"

    assert _run_case(Case).wasSuccessful()
    assert "CADENCE_T_MOCKED" not in os.environ


def test_subprocess_helpers_report_failures():
    ok = execute_subprocess_async([sys.executable, "-c", "print('out')"], quiet=True, echo=False)
    assert ok.returncode == 0 and ok.stdout == ["out"]
    with pytest.raises(RuntimeError, match="failed with returncode 3"):
        execute_subprocess_async(
            [sys.executable, "-c", "import sys; sys.stderr.write('bad'); sys.exit(3)"],
            quiet=True,
            echo=False,
        )
    assert run_command([sys.executable, "-c", "print(7)"], return_stdout=True).strip() == "7"
    with pytest.raises(SubprocessCallException, match="boom"):
        run_command([sys.executable, "-c", "raise SystemExit('boom')"])


def test_regression_dataset_and_model():
    dataset = RegressionDataset(a=2, b=3, length=500, seed=0)
    assert len(dataset) == 500 and set(dataset[0]) == {"x", "y"}
    fit = torch.linalg.lstsq(
        torch.stack([torch.tensor(dataset.x), torch.ones(500)], dim=1),
        torch.tensor(dataset.y)[:, None],
    ).solution.flatten()
    assert abs(fit[0] - 2) < 0.05 and abs(fit[1] - 3) < 0.05  # y = 2x + 3 with noise std 0.1
    model = RegressionModel(a=1, b=2)
    assert model(torch.tensor([1.0, 2.0])).tolist() == [3.0, 4.0]
    assert RegressionDataset(seed=1).x.tolist() == RegressionDataset(seed=1).x.tolist()


def test_examples_helpers():
    lines = [
        "import x\n",
        "def training_function():\n",
        "    # note\n",
        "    a = 1\n",
        "\n",
        "def main():\n",
        "    b\n",
        "if __name__:\n",
    ]
    assert get_function_contents_by_name(lines, "training_function") == lines[1:5]
    assert get_function_contents_by_name(lines, "main") == ["def main():\n", "    b\n"]
    assert clean_lines(lines[1:5]) == ["def training_function():\n", "    a = 1\n"]
    with pytest.raises(ValueError, match="Incorrect function name"):
        get_function_contents_by_name(lines, "other")


SCRIPTS = [
    "test_ops",
    "test_sync",
    "test_script",
    "test_distributed_data_loop",
    "test_cli",
    "test_ddp_comm_hook",
    "test_merge_weights",
    "external_deps/test_checkpointing",
    "external_deps/test_metrics",
]


@pytest.mark.parametrize("script", SCRIPTS)
def test_bundled_script_passes_on_two_processes(script):
    path = path_in_accelerate_package("test_utils", "scripts", *f"{script}.py".split("/"))
    assert path.is_file()
    command = [
        sys.executable,
        "-m",
        "cadence.commands.cli",
        "launch",
        "--num_processes=2",
        "--cpu",
        "-q",
        str(path),
    ]
    result = execute_subprocess_async(
        command, env=os.environ.copy(), quiet=True, echo=False, timeout=300
    )
    assert result.returncode == 0
    assert any("passed" in line or "correctly" in line for line in result.stdout), result.stdout[
        -5:
    ]


def test_bundled_scripts_are_importable_without_running():
    import cadence.test_utils.scripts.test_script as script

    assert callable(script.main) and callable(script._mp_fn)


def test_bundled_notebook_script_passes_from_a_plain_process():
    path = path_in_accelerate_package("test_utils", "scripts", "test_notebook.py")
    result = execute_subprocess_async(
        # Multi-process on CPU (gloo) whatever GPUs this machine has.
        [sys.executable, str(path)],
        env=dict(os.environ, CUDA_VISIBLE_DEVICES=""),
        quiet=True,
        echo=False,
        timeout=300,
    )
    assert "All notebook launcher checks passed." in result.stdout


def test_testing_still_offers_what_it_imported_before_the_split():
    """The availability checks `testing` used to import stay reachable from it (scripts written
    against Accelerate's module import them from there); a name it never had is an ImportError."""
    import cadence.core.availability as availability
    import cadence.test_utils.testing as testing

    assert testing.is_cuda_available is availability.is_cuda_available
    assert testing.is_wandb_available is availability.is_wandb_available
    assert testing.require_cuda.__module__ == "cadence.test_utils.device_requirements"
    with pytest.raises(ImportError, match="no_such_name"):
        exec("from cadence.test_utils.testing import no_such_name", {})
