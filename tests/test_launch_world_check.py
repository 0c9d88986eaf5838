"""Every rank checks that it joined the world its launcher planned (README: "every rank checks it joined
the world the launcher planned"): a stale or foreign environment is a clear error on every rank.

A real torch.distributed.run job of 2 processes, given a `cadence launch` settings record that planned 4.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

from cadence.core.settings import LAUNCH_CONFIG_ENV, encode_launch_config
from harness import free_port

SCRIPT = textwrap.dedent(
    """
    from cadence import PartialState
    PartialState(cpu=True)
    """
)


def test_a_rank_in_a_world_other_than_the_planned_one_refuses_to_run(tmp_path):
    (tmp_path / "job.py").write_text(SCRIPT)
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env[LAUNCH_CONFIG_ENV] = encode_launch_config({"num_processes": 4, "backend": "gloo"})
    result = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2",
         f"--master_port={free_port()}", "job.py"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    output = result.stdout + result.stderr
    assert result.returncode != 0
    assert "`cadence launch` started 4 processes but this one joined a world of 2" in output
    assert "launch with `cadence launch` alone" in output
