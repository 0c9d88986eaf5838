"""Who hosts the rendezvous store (issue 32, case 3): an explicit `is_host` in `--rdzv_conf` always wins.

Several local elastic nodes on a loopback endpoint without `is_host` follow the rule "the first launcher
on the port hosts the store, the others connect". A node told `is_host=0` never hosts it, whichever
launcher starts first; one told to host it (or that must, as machine 0 or the only machine) and that
finds its port taken says so in one line and starts nothing. The plan-level cases are cheap (nothing
starts); one launcher per port-taken case runs for real. The two-node jobs in both start orders are in
test_elastic_launch.py.
"""

from __future__ import annotations

import socket
import subprocess

import pytest
from elastic_helpers import CADENCE, node_env

from cadence.launch.args import build_launch_parser
from cadence.launch.plan import LaunchPlanError, build_plan
from cadence.runtime.hardware import free_port

SPELLINGS = ["1", "true", "True", "T", "yes", "Y", "0", "false", "FALSE", "f", "no", "N"]


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text("print('hi')\n")
    return tmp_path


def plan_for(argv):
    parser, _ = build_launch_parser()
    args, unknown = parser.parse_known_args(argv)
    assert not unknown
    return build_plan(args, env={}, gpu_count=lambda: 0)


def torch_reads(text: str) -> bool | None:
    """What torch's c10d rendezvous makes of `is_host=text` (None: it refuses the value)."""
    from torch.distributed.elastic.rendezvous import RendezvousParameters

    params = RendezvousParameters("c10d", "127.0.0.1:29400", "none", 1, 2, is_host=text)
    try:
        return params.get_as_bool("is_host")
    except ValueError:
        return None


def elastic_local_nodes(*extra: str) -> list[str]:
    return ["--cpu", "--nnodes", "1:2", "--nproc_per_node", "1", "--rdzv_backend", "c10d",
            "--rdzv_endpoint", "127.0.0.1:29731", *extra, "train.py"]  # fmt: skip


@pytest.mark.parametrize("spelling", SPELLINGS)
@pytest.mark.parametrize("nodes", ["1:2", "2"], ids=["elastic", "fixed"])
@pytest.mark.parametrize("endpoint", ["127.0.0.1", "localhost"])
def test_an_explicit_is_host_decides_who_hosts_the_store_as_torch_reads_it(
    workdir, spelling, nodes, endpoint
):
    plan = plan_for(
        ["--cpu", "--nnodes", nodes, "--nproc_per_node", "1", "--rdzv_backend", "c10d",
         "--rdzv_endpoint", f"{endpoint}:29731", "--rdzv_conf", f"timeout=60,is_host={spelling}",
         "train.py"]
    )  # fmt: skip
    hosts = torch_reads(spelling)
    assert hosts is not None  # every spelling here is one torch accepts
    assert (plan.store.address is not None) == hosts, plan.store
    # Told to host: it alone hosts (a taken port is an error); told not to: it never binds the port.
    assert plan.store.must_host == hosts
    assert f"is_host={spelling} in --rdzv_conf" in plan.store.reason
    # torch gets the user's value unchanged, so it agrees with the launcher.
    conf = plan.torchrun_args[plan.torchrun_args.index("--rdzv_conf") + 1]
    assert f"is_host={spelling}" in conf.split(",")


def test_without_is_host_the_first_local_node_hosts_and_the_others_connect(workdir):
    store = plan_for(elastic_local_nodes()).store
    assert store.address == "127.0.0.1" and not store.must_host
    conf = plan_for(elastic_local_nodes()).torchrun_args
    assert "is_host" not in conf[conf.index("--rdzv_conf") + 1]


@pytest.mark.parametrize("value", ["maybe", "2", "on", "hosted"])
def test_an_is_host_torch_would_refuse_is_refused_before_anything_starts(workdir, value):
    assert torch_reads(value) is None  # torch refuses it too, but only once the launch started
    with pytest.raises(LaunchPlanError, match=rf"--rdzv_conf is_host='{value}' is not a boolean"):
        plan_for(elastic_local_nodes("--rdzv_conf", f"is_host={value}"))


@pytest.mark.parametrize(
    "flags",
    [
        ["--nnodes", "1:2", "--rdzv_conf", "is_host=1"],
        ["--nnodes", "2", "--rdzv_conf", "is_host=yes"],
    ],
    ids=["elastic", "fixed"],
)
def test_a_launcher_told_to_host_finds_the_port_taken_and_says_so_in_one_line(tmp_path, flags):
    (tmp_path / "train.py").write_text("open('ran', 'w').close()\n")
    with socket.socket() as holder:  # another launcher's store already listens there
        holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        holder.bind(("127.0.0.1", free_port()))
        holder.listen(8)
        port = holder.getsockname()[1]
        result = subprocess.run(
            [*CADENCE, "launch", "--cpu", "--quiet", "--nproc_per_node", "1", *flags,
             "--rdzv_backend", "c10d", "--rdzv_endpoint", f"127.0.0.1:{port}", "train.py"],
            cwd=tmp_path,
            env=node_env(tmp_path),
            capture_output=True,
            text=True,
            timeout=120,
        )  # fmt: skip
    assert result.returncode == 1, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr  # no traceback, no torch warnings
    (line,) = lines
    assert line.startswith(f"cadence launch: cannot host the rendezvous store on 127.0.0.1:{port} ")
    assert f"(this node hosts it: {flags[-1]} in --rdzv_conf)" in line, line
    assert "another launcher already holds that port" in line, line
    assert "start the other nodes' launchers with is_host=0" in line, line
    assert not (tmp_path / "ran").exists()  # no worker started


@pytest.mark.parametrize(
    "argv, address, must_host, reason",
    [
        (["--num_processes", "2"], "127.0.0.1", True, "one machine"),
        (["--num_machines", "2", "--num_processes", "2", "--machine_rank", "0",
          "--main_process_ip", "127.0.0.1"], "127.0.0.1", True, "machine rank 0 hosts it"),
        (["--num_machines", "2", "--num_processes", "2", "--machine_rank", "1",
          "--main_process_ip", "127.0.0.1"], None, False, "machine rank 0 hosts it"),
        (["--num_machines", "2", "--num_processes", "2", "--rdzv_backend", "c10d",
          "--main_process_ip", "127.0.0.1"], "127.0.0.1", True, "endpoint's address"),
    ],
    ids=["one-machine", "static-rank-0", "static-rank-1", "c10d-routed"],
)  # fmt: skip
def test_without_is_host_the_launcher_that_must_host_the_store_is_decided_as_before(
    workdir, argv, address, must_host, reason
):
    store = plan_for(["--cpu", *argv, "train.py"]).store
    assert (store.address, store.must_host) == (address, must_host), store
    assert reason in store.reason
    if must_host:
        assert store.remedy  # what to do when the port is taken
