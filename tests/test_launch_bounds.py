"""Every numeric launch setting is bounded before anything starts, from whichever layer it comes (flag,
CADENCE_<FLAG> environment variable, config file), and the error says what is wrong and what to do.

The absurd cases go through the real CLI (a subprocess that must exit 2 at once, having started nothing);
the matrix of values is checked on the plan itself (nothing is started either way).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from cadence.launch.args import build_launch_parser
from cadence.launch.bounds import PROCESSES_PER_CORE
from cadence.launch.plan import LaunchPlanError, build_plan
from cadence.runtime.hardware import usable_cpu_count

CADENCE = [sys.executable, "-m", "cadence.commands.cli"]
HUGE = "1" + "0" * 29
TOO_MANY_HERE = usable_cpu_count() * PROCESSES_PER_CORE + 1


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    # The script leaves a mark if it ever runs.
    (tmp_path / "train.py").write_text("open('started', 'w').write('yes')\n")
    return tmp_path


def plan_for(argv, env=None):
    parser, _ = build_launch_parser()
    args, unknown = parser.parse_known_args([*argv, "train.py"])
    assert not unknown
    return build_plan(args, env={} if env is None else env, gpu_count=lambda: 0)


def cli(argv, workdir, env=None, timeout=60):
    environment = {k: v for k, v in os.environ.items() if not k.startswith("CADENCE_")}
    return subprocess.run(
        [*CADENCE, "launch", *argv, "train.py"], cwd=workdir, capture_output=True, text=True,
        timeout=timeout, env={**environment, **(env or {})},
    )  # fmt: skip


@pytest.mark.parametrize(
    "argv, env",
    [
        (["--num_processes", HUGE], {}),
        ([], {"CADENCE_NUM_PROCESSES": HUGE}),
        (["--cpu", "--num_processes", HUGE, "--oversubscribe"], {}),
    ],
    ids=["flag", "env", "oversubscribed"],
)
def test_an_absurd_process_count_is_refused_at_once(argv, env, workdir):
    # Before: no output and ~80 MB/s of memory growth forever. The timeout only guards against that.
    result = cli(argv, workdir, env)
    assert result.returncode == 2, result.stderr
    assert f"--num_processes {HUGE}" in result.stderr
    assert "it is the TOTAL over all machines" in result.stderr
    assert "Nothing was started" in result.stderr
    assert not (workdir / "started").exists()


def test_more_processes_than_cores_times_eight_need_oversubscribe(workdir):
    refused = cli(["--cpu", "--num_processes", str(TOO_MANY_HERE)], workdir)
    assert refused.returncode == 2
    assert f"{TOO_MANY_HERE} processes per machine" in refused.stderr
    assert f"at most {TOO_MANY_HERE - 1}" in refused.stderr and "--oversubscribe" in refused.stderr
    assert not (workdir / "started").exists()
    for argv, env in (
        (["--oversubscribe"], {}),
        ([], {"CADENCE_OVERSUBSCRIBE": "1"}),
    ):
        allowed = cli(
            ["--cpu", "--num_processes", str(TOO_MANY_HERE), "--dry_run", *argv], workdir, env
        )
        assert allowed.returncode == 0, allowed.stderr
        assert f"--nproc_per_node {TOO_MANY_HERE}" in allowed.stdout


def test_the_per_machine_limit_counts_processes_per_machine(workdir):
    # 2 machines: the same total is half as many per machine.
    total = 2 * (TOO_MANY_HERE - 1)
    plan = plan_for(
        [
            "--cpu",
            "--num_processes",
            str(total),
            "--num_machines",
            "2",
            "--main_process_ip",
            "10.0.0.1",
        ]
    )
    assert plan.nproc_per_node == TOO_MANY_HERE - 1


@pytest.mark.parametrize(
    "argv, env, fragment",
    [
        (["--num_machines", HUGE, "--main_process_ip", "10.0.0.1"], {}, f"--num_machines {HUGE}"),
        (["--num_machines", "2", "--machine_rank", "2", "--main_process_ip", "10.0.0.1"], {},
         "--machine_rank 2 must be in [0, 2)"),
        (["--main_process_port", "65536"], {}, "is not a TCP port (0-65535); pass a port"),
        ([], {"CADENCE_MAIN_PROCESS_PORT": "-1"}, "--main_process_port -1 is not a TCP port"),
        (["--num_cpu_threads_per_process", HUGE], {}, "threads per process"),
        ([], {"OMP_NUM_THREADS": HUGE}, "(env OMP_NUM_THREADS) is more than 4096 threads"),
        (["--max_restarts", "1001"], {}, "--max_restarts 1001 (flag) must be a number of restarts"),
        ([], {"CADENCE_MAX_RESTARTS": HUGE}, "must be a number of restarts (between 0 and 1000)"),
        (["--monitor_interval", "1e9"], {}, "is more than 3600 s between health checks"),
        (["--monitor_interval", "nan"], {}, "--monitor_interval must be a positive number"),
        (["--gradient_accumulation_steps", HUGE], {}, "must be a number of steps"),
        (["--use_fsdp", "--fsdp_min_num_params", "-5"], {}, "must be a number of parameters"),
        (["--use_deepspeed", "--gradient_clipping", "inf"], {}, "--gradient_clipping inf must be a finite"),
        ([], {"CADENCE_STUCK_TIMEOUT": "1e400"}, "CADENCE_STUCK_TIMEOUT='1e400' is more than 604800 seconds"),
        ([], {"CADENCE_STUCK_TIMEOUT": "nan"}, "CADENCE_STUCK_TIMEOUT='nan' must be a positive number"),
        ([], {"CADENCE_STUCK_TIMEOUT": "-3"}, "CADENCE_STUCK_TIMEOUT='-3' must be a positive number"),
        ([], {"CADENCE_STUCK_TIMEOUT": "soon"}, "CADENCE_STUCK_TIMEOUT='soon' is not a number of seconds"),
        ([], {"CADENCE_STALL_REPORT": "inf"}, "CADENCE_STALL_REPORT='inf' is more than"),
        ([], {"CADENCE_JOB_TOKEN": "abc"}, "CADENCE_JOB_TOKEN is 3 characters long"),
    ],
)  # fmt: skip
def test_numeric_settings_out_of_bounds_are_refused(argv, env, fragment, workdir):
    with pytest.raises(LaunchPlanError) as refused:
        plan_for(argv, env)
    assert fragment in str(refused.value)
    assert "Nothing was started" in str(refused.value)


def test_config_file_values_are_bounded_too(workdir):
    config = workdir / "cfg.json"
    config.write_text(
        json.dumps(
            {"compute_environment": "LOCAL_MACHINE", "distributed_type": "MULTI_CPU", "use_cpu": True,
             "num_processes": int(HUGE), "num_machines": 1, "main_process_port": 99999}
        )
    )  # fmt: skip
    result = cli(["--config_file", str(config)], workdir)
    assert result.returncode == 2
    assert f"--num_processes {HUGE} (config file)" in result.stderr
    assert "--main_process_port 99999 is not a TCP port" in result.stderr


def test_sane_values_still_plan(workdir):
    plan = plan_for(
        ["--cpu", "--num_processes", "2", "--max_restarts", "3", "--monitor_interval", "0.5"],
        {"CADENCE_STUCK_TIMEOUT": "120", "CADENCE_STALL_REPORT": "20",
         "CADENCE_JOB_TOKEN": "0123456789abcdef0123"},
    )  # fmt: skip
    assert plan.nproc_per_node == 2


def test_notebook_launcher_bounds_its_numbers_before_forking():
    from cadence import debug_launcher, notebook_launcher

    huge = int(HUGE)
    with pytest.raises(ValueError, match=f"num_processes={huge}"):
        notebook_launcher(print, num_processes=huge)
    with pytest.raises(ValueError, match=f"num_processes={huge}"):
        debug_launcher(print, num_processes=huge)
    with pytest.raises(ValueError, match=r"use_port must be a TCP port \(0-65535\), got '70000'"):
        notebook_launcher(print, num_processes=2, use_port="70000")
    with pytest.raises(ValueError, match=r"node_rank must be in \[0, 2\), got 2"):
        notebook_launcher(print, num_processes=2, num_nodes=2, node_rank=2)
    with pytest.raises(ValueError, match="max_restarts must be between 0 and 1000"):
        notebook_launcher(print, num_processes=2, max_restarts=-1)
    with pytest.raises(ValueError, match="monitor_interval must be a number of seconds"):
        notebook_launcher(print, num_processes=2, monitor_interval=float("inf"))


def test_debug_launcher_refuses_more_than_cores_times_eight_without_oversubscribe(monkeypatch):
    from cadence import debug_launcher

    monkeypatch.delenv("CADENCE_OVERSUBSCRIBE", raising=False)
    with pytest.raises(ValueError, match="CADENCE_OVERSUBSCRIBE=1"):
        debug_launcher(print, num_processes=TOO_MANY_HERE)


@pytest.mark.parametrize("bad", [float("inf"), 1e400, float("nan"), -1, "soon", 10**30])
def test_watchdog_delays_are_bounded_in_every_source(bad):
    """Workers check again (code, environment, launch config), so a job started without `cadence launch`
    refuses the same values before it starts its process group."""
    from cadence.diagnostics.settings import resolve_watch_settings

    for explicit, launch, env in (
        (bad, {}, {}),
        (None, {}, {"CADENCE_STUCK_TIMEOUT": str(bad)}),
        (None, {"stuck_timeout": bad}, {}),
        (None, {}, {"CADENCE_STALL_REPORT": str(bad)}),
        (None, {"stall_report": bad}, {}),
    ):
        with pytest.raises(ValueError, match="seconds"):
            resolve_watch_settings(explicit, launch, env=env)
