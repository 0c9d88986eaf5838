"""Two machines for real: two Linux network namespaces joined by a veth pair, one `cadence launch` in each.

Inside a namespace the hostname resolves to 127.0.0.1, which breaks gloo's and c10d's guesses of the local
address; `cadence launch` must find the right interface and address by itself. Needs root and `ip`.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap

import pytest

pytestmark = [
    pytest.mark.skipif(
        not sys.platform.startswith("linux"), reason="network namespaces are Linux-only"
    ),
    pytest.mark.skipif(os.geteuid() != 0, reason="creating network namespaces needs root"),
    pytest.mark.skipif(
        shutil.which("ip") is None, reason="the `ip` tool (iproute2) is not installed"
    ),
]

MAIN_IP, OTHER_IP = "10.213.7.1", "10.213.7.2"

SCRIPT = """\
import json, sys
import torch
import torch.distributed as dist
torch.set_num_threads(1)
from cadence import PartialState

state = PartialState()
total = torch.tensor([float(state.process_index + 1)])
dist.all_reduce(total)


def listening(port):  # addresses of the sockets listening on `port` in this machine's network
    found = []
    for line in open("/proc/net/tcp").read().splitlines()[1:] + open("/proc/net/tcp6").read().splitlines()[1:]:
        fields = line.split()
        address, hex_port = fields[1].split(":")
        if int(hex_port, 16) == port and fields[3] == "0A":
            found.append(address)
    return found


with open(sys.argv[1], "w") as handle:
    json.dump({"rank": state.process_index, "world": state.num_processes, "sum": total.item(),
               "listening": listening(int(sys.argv[2]))}, handle)
"""
# /proc/net/tcp spells an IPv4 address as one little-endian hex word.
MAIN_IP_HEX = "".join(f"{int(part):02X}" for part in reversed(MAIN_IP.split(".")))


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True)


@pytest.fixture
def two_machines():
    tag = f"{os.getpid() % 100000}"
    names = (f"cadA{tag}", f"cadB{tag}")
    links = (f"vcA{tag}", f"vcB{tag}")
    try:
        for name in names:
            _ip("netns", "add", name)
        _ip("link", "add", links[0], "type", "veth", "peer", "name", links[1])
        for name, link, address in zip(names, links, (MAIN_IP, OTHER_IP)):
            _ip("link", "set", link, "netns", name)
            _ip("-n", name, "addr", "add", f"{address}/24", "dev", link)
            _ip("-n", name, "link", "set", link, "up")
            _ip("-n", name, "link", "set", "lo", "up")
    except subprocess.CalledProcessError as err:
        for name in names:
            subprocess.run(["ip", "netns", "del", name], capture_output=True)
        pytest.skip(f"cannot create network namespaces here: {err.stderr.decode().strip()}")
    yield names
    for name in names:
        subprocess.run(["ip", "netns", "del", name], capture_output=True)


def _env(tmp_path) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("CADENCE_", "GLOO_", "TORCHELASTIC_", "PET_"))
    }
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(name, None)
    env["HF_HOME"] = str(tmp_path / "hf")
    env["CUDA_VISIBLE_DEVICES"] = ""  # CPU workers (gloo), also on a GPU machine
    return env


@pytest.mark.parametrize("rdzv_backend, port", [("static", "29777"), ("c10d", "29778")])
def test_two_machines_form_one_world(tmp_path, two_machines, rdzv_backend, port):
    (tmp_path / "allreduce.py").write_text(textwrap.dedent(SCRIPT))
    launchers = []
    for rank, namespace in enumerate(two_machines):
        command = [
            "ip", "netns", "exec", namespace, sys.executable, "-m", "cadence.commands.cli", "launch",
            "--num_machines", "2", "--machine_rank", str(rank), "--num_processes", "2",
            "--main_process_ip", MAIN_IP, "--main_process_port", port, "--rdzv_backend", rdzv_backend,
            "allreduce.py", str(tmp_path / f"machine{rank}.json"), port,
        ]  # fmt: skip
        launchers.append(
            subprocess.Popen(
                command,
                cwd=tmp_path,
                # One secret shared by both machines, for the watchdog's signed records.
                env={**_env(tmp_path), "CADENCE_JOB_TOKEN": "9f" * 32},
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    outputs = []
    try:
        for launcher in launchers:
            outputs.append(launcher.communicate(timeout=240))
    finally:
        for launcher in launchers:
            if launcher.poll() is None:
                launcher.kill()
    for launcher, (_, stderr) in zip(launchers, outputs):
        assert launcher.returncode == 0, stderr
    results = [json.loads((tmp_path / f"machine{rank}.json").read_text()) for rank in range(2)]
    assert sorted(r["rank"] for r in results) == [0, 1]
    assert all(r["world"] == 2 and r["sum"] == 3.0 for r in results)
    # The rendezvous store on the main machine listens on the main address, not on every interface.
    main = next(r for r in results if r["rank"] == 0)
    assert main["listening"] == [MAIN_IP_HEX], main["listening"]
