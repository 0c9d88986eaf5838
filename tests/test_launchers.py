"""notebook_launcher and debug_launcher start real forked worker processes through torch's elastic agent."""

import os
import subprocess
import sys
import textwrap

import pytest

from harness import free_port

SCRIPT = textwrap.dedent(
    """
    import sys, torch
    from cadence import notebook_launcher, debug_launcher

    def training_function(out_dir, tag):
        from cadence import Accelerator
        acc = Accelerator()
        total = acc.reduce(torch.tensor([acc.process_index + 1.0]), reduction="sum")
        with open(f"{out_dir}/{tag}{acc.process_index}.txt", "w") as f:
            f.write(f"{acc.num_processes} {acc.distributed_type} {acc.mixed_precision} {total.item()}")

    if __name__ == "__main__":
        out_dir, port = sys.argv[1], sys.argv[2]
        notebook_launcher(training_function, (out_dir, "nb"), num_processes=2, mixed_precision="bf16",
                          use_port=port)
        debug_launcher(training_function, (out_dir, "debug"), num_processes=3)
        notebook_launcher(training_function, (out_dir, "single"))
    """
)


def test_notebook_and_debug_launcher_from_a_script(tmp_path):
    script = tmp_path / "launch.py"
    script.write_text(SCRIPT)
    result = subprocess.run(
        [sys.executable, str(script), str(tmp_path), str(free_port())],
        capture_output=True, text=True, timeout=180, env=dict(os.environ, OMP_NUM_THREADS="1"),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert [(tmp_path / f"nb{r}.txt").read_text() for r in range(2)] == [
        "2 DistributedType.MULTI_CPU bf16 3.0"
    ] * 2
    assert [(tmp_path / f"debug{r}.txt").read_text() for r in range(3)] == [
        "3 DistributedType.MULTI_CPU no 6.0"
    ] * 3
    assert (tmp_path / "single0.txt").read_text() == "1 DistributedType.NO no 1.0"


FAILING = textwrap.dedent(
    """
    import sys
    from cadence import notebook_launcher

    def broken():
        from cadence import Accelerator
        acc = Accelerator()
        if acc.process_index == 1:
            raise ValueError("rank one is broken")
        acc.wait_for_everyone()

    if __name__ == "__main__":
        notebook_launcher(broken, num_processes=2, use_port=sys.argv[1])
    """
)


def test_notebook_launcher_reports_the_failing_rank(tmp_path):
    script = tmp_path / "fail.py"
    script.write_text(FAILING)
    result = subprocess.run(
        [sys.executable, str(script), str(free_port())],
        capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert result.returncode != 0
    assert "notebook_launcher: rank 1 failed (exit code 1)" in result.stderr
    assert "ValueError: rank one is broken" in result.stderr
    assert "rank 0: stopped because rank 1 failed" in result.stderr


def test_bad_arguments_fail_before_starting():
    from cadence import notebook_launcher

    with pytest.raises(ValueError, match="num_processes"):
        notebook_launcher(print, num_processes=0)
    with pytest.raises(ValueError, match="mixed_precision"):
        notebook_launcher(print, num_processes=2, mixed_precision="fp12")


def test_notebook_launcher_in_a_real_jupyter_kernel(tmp_path):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    cells = [
        "import torch\nfrom cadence import notebook_launcher",
        textwrap.dedent(
            f"""
            def train():
                from cadence import Accelerator
                acc = Accelerator()
                gathered = acc.gather(torch.tensor([acc.process_index]))
                open(f"{tmp_path}/kernel{{acc.process_index}}.txt", "w").write(str(gathered.tolist()))
            """
        ),
        f"notebook_launcher(train, num_processes=2, use_port='{free_port()}')",
    ]
    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells])
    nbclient.NotebookClient(notebook, timeout=180, kernel_name="python3").execute()
    assert [(tmp_path / f"kernel{r}.txt").read_text() for r in range(2)] == ["[0, 1]"] * 2
