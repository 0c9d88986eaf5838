"""notebook_launcher and debug_launcher start real forked worker processes through torch's elastic agent."""

import os
import subprocess
import sys
import textwrap

import pytest

from harness import free_port

# These scripts are about CPU workers (gloo): they hide the GPUs, so that on a GPU machine two ranks are
# not started on one GPU. The CUDA tests below show the GPU side.
CPU_ENV = dict(os.environ, OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="")

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
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    result = subprocess.run(
        [sys.executable, str(script), str(tmp_path), str(free_port())],
        capture_output=True, text=True, timeout=180, env=dict(CPU_ENV, TMPDIR=str(scratch)),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    # The workers' log folders are removed once every launch succeeded (nothing is left in the temp dir).
    assert [p.name for p in scratch.iterdir() if p.name.startswith("cadence-launch-")] == []
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
        capture_output=True, text=True, timeout=180, env=CPU_ENV,
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


def test_notebook_launcher_in_a_real_jupyter_kernel(tmp_path, monkeypatch):
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
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # the kernel's two workers are CPU workers
    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells])
    nbclient.NotebookClient(notebook, timeout=180, kernel_name="python3").execute()
    assert [(tmp_path / f"kernel{r}.txt").read_text() for r in range(2)] == ["[0, 1]"] * 2


NO_CUDA_IN_PARENT = textwrap.dedent(
    """
    import sys, torch
    import cadence, cadence.utils
    from cadence import Accelerator, notebook_launcher  # importing Cadence must not touch CUDA

    def probe(out_dir):
        import os
        rank = os.environ["RANK"]
        if torch.cuda.is_available():
            # Fails with "Cannot re-initialize CUDA in forked subprocess" if the parent touched CUDA.
            value = torch.ones(2, device="cuda").sum().item()
            where = "cuda"
        else:
            value, where = torch.ones(2).sum().item(), "cpu"
        with open(f"{out_dir}/probe{rank}.txt", "w") as f:
            f.write(f"{where} {value}")

    if __name__ == "__main__":
        out_dir, port = sys.argv[1], sys.argv[2]
        notebook_launcher(probe, (out_dir,), num_processes=2, use_port=port)
        print("parent initialized CUDA:", torch.cuda.is_initialized())
    """
)


def test_notebook_launcher_never_initialises_cuda_in_the_parent(tmp_path):
    """Runs on CPU and GPU machines alike: on a GPU the forked workers allocate on cuda:0, which
    fails if the parent created a CUDA context; on CPU they report cpu. The parent stays uninitialised."""
    import torch

    if torch.cuda.device_count() == 1:
        pytest.skip("two forked workers need two GPUs, or none (on CPU)")

    script = tmp_path / "probe.py"
    script.write_text(NO_CUDA_IN_PARENT)
    result = subprocess.run(
        [sys.executable, str(script), str(tmp_path), str(free_port())],
        capture_output=True, text=True, timeout=180, env=dict(os.environ, OMP_NUM_THREADS="1"),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert "parent initialized CUDA: False" in result.stdout
    where = "cuda" if torch.cuda.is_available() else "cpu"
    assert [(tmp_path / f"probe{r}.txt").read_text() for r in range(2)] == [f"{where} 2.0"] * 2


def test_notebook_launcher_refuses_a_notebook_that_initialised_cuda(monkeypatch):
    import torch

    from cadence import notebook_launcher

    started = []
    # Simulates a notebook that already ran `.cuda()`: only this parent-side query is replaced.
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    with pytest.raises(RuntimeError, match="CUDA has already been initialized") as error:
        notebook_launcher(lambda: started.append(1), num_processes=2, use_port=str(free_port()))
    assert "inside your training function" in str(error.value)
    assert started == []


def test_notebook_launcher_refuses_an_accelerator_built_in_the_notebook():
    from cadence import Accelerator, notebook_launcher

    Accelerator(cpu=True)
    with pytest.raises(
        ValueError, match="should only be initialized inside your training function"
    ):
        notebook_launcher(print, num_processes=2, use_port=str(free_port()))
