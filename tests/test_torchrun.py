"""A real `torch.distributed.run` launch: Cadence forms its own gloo group from the torchrun environment."""

import os
import subprocess
import sys
import textwrap

from harness import free_port

SCRIPT = textwrap.dedent(
    """
    import datetime, sys, torch
    import torch.distributed as dist
    from cadence import Accelerator, InitProcessGroupKwargs
    acc = Accelerator(kwargs_handlers=[InitProcessGroupKwargs(timeout=datetime.timedelta(seconds=77))])
    backend = dist.distributed_c10d._get_default_group()._get_backend(torch.device("cpu"))
    timeout = backend.options._timeout.total_seconds()
    # Plain torchrun finalizes the interpreter: a gloo backend a global still holds would be
    # destroyed then, its threads meeting a half-torn-down interpreter (a rare SIGABRT; `cadence
    # launch` ends its workers before finalization). Cadence destroys the group at exit.
    del backend
    line = " ".join(map(str, ["RESULT", acc.process_index, acc.num_processes, acc.distributed_type, dist.get_backend(),
          timeout, acc.gather(torch.tensor([acc.process_index * 10])).tolist()]))
    open(f"{sys.argv[1]}/rank{acc.process_index}.txt", "w").write(line)
    """
)


def run_torchrun(tmp_path, script, nproc=2, extra_env=None, args=()):
    path = tmp_path / "script.py"
    path.write_text(script)
    # CPU workers (gloo), also on a GPU machine: never two ranks on one GPU.
    env = dict(os.environ, OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="", **(extra_env or {}))
    return subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}",
         f"--master_port={free_port()}", str(path), *args],
        capture_output=True, text=True, timeout=120, env=env,
    )  # fmt: skip


def test_two_processes_under_torchrun_are_really_distributed(tmp_path):
    result = run_torchrun(tmp_path, SCRIPT, args=[str(tmp_path)])
    assert result.returncode == 0, result.stderr
    lines = [(tmp_path / f"rank{r}.txt").read_text() for r in range(2)]
    assert lines == [
        "RESULT 0 2 DistributedType.MULTI_CPU gloo 77.0 [0, 10]",
        "RESULT 1 2 DistributedType.MULTI_CPU gloo 77.0 [0, 10]",
    ]
    # The group is destroyed at exit: no warning about a leaked process group.
    assert "destroy_process_group() was not called" not in result.stderr


def test_demo_example_runs(tmp_path):
    example = os.path.join(os.path.dirname(__file__), "..", "examples", "process_control.py")
    result = run_torchrun(tmp_path, open(example).read())
    assert result.returncode == 0, result.stderr
    assert "gather of every rank's index: [0, 1]" in result.stdout
    assert result.stdout.count("inside main_process_first") == 2


def test_demo_training_example_through_cadence_launch():
    example = os.path.join(os.path.dirname(__file__), "..", "examples", "train_regression.py")
    cadence = os.path.join(os.path.dirname(sys.executable), "cadence")
    result = subprocess.run(
        [cadence, "launch", "--cpu", "--num_processes", "2", example],
        capture_output=True, text=True, timeout=300, env=dict(os.environ, OMP_NUM_THREADS="1"),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Training on 2 process(es): MULTI_CPU" in result.stdout
    # gather_for_metrics drops the duplicated samples: exactly the 100 evaluation samples
    assert result.stdout.count("over 100 samples") == 8
    learned = result.stdout.split("learned weights:")[1].strip()
    weights = [float(w) for w in learned.strip("[]").split(",")]
    assert all(abs(w - target) < 0.5 for w, target in zip(weights, range(1, 9)))
