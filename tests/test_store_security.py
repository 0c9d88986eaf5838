"""The rendezvous store of a `cadence launch` job, seen from an outsider: where it listens, and whether a
process without the job's token can stop the job through it.

Real jobs (`cadence launch --cpu`, 2 gloo processes); the outsider is this test process, which connects
to the job's TCPStore as any local process could, lists its keys and writes forged watchdog records.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
import threading
import time
from datetime import timedelta
from pathlib import Path

import pytest

from cadence.diagnostics.signing import JOB_TOKEN_ENV, RecordSigner
from cadence.runtime.hardware import local_address_towards

# The outsider below finds the watchdog's keys as an attacker would, by listing the store's keys:
# TCPStore.list_keys is newer than some declared torch releases (absent on 2.7 and 2.9).
needs_list_keys = pytest.mark.skipif(
    not hasattr(__import__("torch").distributed.TCPStore, "list_keys"),
    reason="this torch's TCPStore has no list_keys (the outsider's way to find the keys)",
)

CADENCE = [sys.executable, "-m", "cadence.commands.cli"]

# Each rank says where the job's store is, then trains until the test says "go on", then a few more
# steps (so its watchdog reads the store several times after the forgery), then exits 0.
SCRIPT = textwrap.dedent(
    """
    import json, logging, os, sys, time, torch
    from cadence import Accelerator
    from cadence.utils import broadcast_object_list

    logging.basicConfig(level=logging.WARNING)
    logging.getLogger("cadence.diagnostics").setLevel(logging.DEBUG)  # to see ignored records
    out = sys.argv[1]
    acc = Accelerator(cpu=True)
    rank = acc.process_index
    info = {"port": int(os.environ["MASTER_PORT"]), "run": os.environ.get("TORCHELASTIC_RUN_ID"),
            "pid": os.getpid()}
    if rank == 0 and os.environ.get("LEAK_TOKEN_FOR_CONTROL"):
        info["token"] = os.environ.get("CADENCE_JOB_TOKEN")
    open(f"{out}/rank{rank}.json.tmp", "w").write(json.dumps(info))
    os.replace(f"{out}/rank{rank}.json.tmp", f"{out}/rank{rank}.json")
    while True:  # rank 0 decides, so every rank runs the same number of collectives
        go_on = [os.path.exists(f"{out}/go_on")]
        broadcast_object_list(go_on)
        if go_on[0]:
            break
        acc.gather(torch.ones(1))
        time.sleep(0.05)
    # Several watchdog ticks (CADENCE_STUCK_TIMEOUT=2: a tick every 0.5 s) with the forgery in place.
    for _ in range(60):
        acc.gather(torch.ones(1))
        time.sleep(0.05)
    acc.wait_for_everyone()
    open(f"{out}/done{rank}", "w").write("ok")
    """
)


def _start_job(tmp_path: Path, extra_env: dict[str, str] | None = None) -> subprocess.Popen:
    (tmp_path / "job.py").write_text(SCRIPT)
    env = dict(os.environ, OMP_NUM_THREADS="1", CADENCE_STUCK_TIMEOUT="2", **(extra_env or {}))
    env.pop(JOB_TOKEN_ENV, None)
    return subprocess.Popen(
        [*CADENCE, "launch", "--cpu", "--num_processes", "2", "--quiet", "job.py", str(tmp_path)],
        cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True,
    )  # fmt: skip


def _wait_for_ranks(tmp_path: Path, job: subprocess.Popen) -> list[dict]:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        files = [tmp_path / f"rank{r}.json" for r in range(2)]
        if all(f.exists() for f in files):
            return [json.loads(f.read_text()) for f in files]
        if job.poll() is not None:
            raise AssertionError(f"the job ended early:\n{job.stdout.read()}")
        time.sleep(0.1)
    _stop(job)
    raise AssertionError("the job did not start")


def _finish(job: subprocess.Popen, tmp_path: Path) -> str:
    (tmp_path / "go_on").write_text("")
    try:
        output, _ = job.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        _stop(job)
        raise AssertionError("the job did not end") from None
    return output


def _stop(job: subprocess.Popen) -> None:
    import signal

    try:
        os.killpg(job.pid, signal.SIGTERM)
        job.communicate(timeout=30)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        os.killpg(job.pid, signal.SIGKILL)


def _listening_addresses(port: int) -> list[str]:
    """Local addresses of the sockets listening on `port`, from the kernel's socket tables."""
    found = []
    for table, width in (("/proc/net/tcp", 8), ("/proc/net/tcp6", 32)):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            address, hex_port = fields[1].split(":")
            if int(hex_port, 16) == port and fields[3] == "0A":  # 0A: LISTEN
                raw = bytes.fromhex(address)
                # The kernel prints each 32-bit word in host (little-endian) order.
                words = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
                family = socket.AF_INET if width == 8 else socket.AF_INET6
                found.append(socket.inet_ntop(family, words))
    return found


def _outsider_store(port: int):
    from torch.distributed import TCPStore

    return TCPStore("127.0.0.1", port, None, False, timedelta(seconds=30))


def _watch_prefix(store) -> str:
    """The full prefix of the watchdog's keys, found as an outsider would: by listing the keys."""
    for _ in range(600):  # until rank 0's watchdog has published (its first tick)
        keys = [k for k in store.list_keys() if "cadence/watch/" in k and k.endswith("/rank/0")]
        if keys:
            return keys[0][: -len("rank/0")]
        time.sleep(0.1)
    raise AssertionError("the watchdog's keys never appeared in the store")


FORGED_STOP = {"kind": "failed", "rank": 1, "error": "ForgedByOutsider: stop", "site": "x.py:1"}


def _forge(store, prefix: str, signer: RecordSigner | None) -> None:
    """What an outsider writes: a stop record, and rank 1's state claiming another collective."""
    stop = json.dumps({**FORGED_STOP, "time": time.time()})
    state = json.dumps(
        {"rank": 1, "beat": time.time() + 3600, "phase": "collective", "seq": 1, "op": "forged_op",
         "since": 0, "site": "forged.py:1", "done": 0}
    )  # fmt: skip
    if signer is None:  # no secret: unsigned, and with a made-up signature
        store.set(prefix + "stop", stop)
        store.set(prefix + "rank/1", "0" * 64 + "." + state)
    else:
        # Signed as the watchdog signs: over its own key, below the process group's store prefix.
        own_key = prefix[prefix.index("cadence/watch/") :] + "stop"
        store.set(prefix + "stop", signer.sign(own_key, stop))


@pytest.fixture(scope="module")
def untokened_outsider_job(tmp_path_factory) -> dict:
    """One job for the two tests below: while it runs, where its store listens and whether another
    address of this machine reaches it; then (where TCPStore.list_keys exists) the unsigned forgery;
    then its end. (Each test used to start the same job for itself.)"""
    tmp_path = tmp_path_factory.mktemp("outsider")
    seen: dict = {"tmp_path": tmp_path, "forged": False}
    job = _start_job(tmp_path)
    try:
        port = _wait_for_ranks(tmp_path, job)[0]["port"]
        seen["addresses"] = _listening_addresses(port)
        outside = local_address_towards("192.0.2.1", 9)  # a documentation address: never sent to
        seen["outside"] = outside
        if outside and not outside.startswith("127."):
            try:
                socket.create_connection((outside, port), timeout=5).close()
                seen["outside_connected"] = True
            except OSError:
                seen["outside_connected"] = False
        if hasattr(__import__("torch").distributed.TCPStore, "list_keys"):
            store = _outsider_store(port)
            _forge(store, _watch_prefix(store), signer=None)
            seen["forged"] = True
    finally:
        seen["output"] = _finish(job, tmp_path)
    seen["returncode"] = job.returncode
    return seen


def test_single_machine_store_listens_on_loopback_only(untokened_outsider_job):
    seen = untokened_outsider_job
    assert seen["returncode"] == 0, seen["output"]
    assert seen["addresses"], "nothing listened on the store's port"
    assert set(seen["addresses"]) == {"127.0.0.1"}, seen["addresses"]
    outside = seen["outside"]
    if outside and not outside.startswith("127."):
        assert seen["outside_connected"] is False, f"{outside} reached the store"


@needs_list_keys
def test_an_outsider_without_the_token_cannot_stop_the_job(untokened_outsider_job):
    seen = untokened_outsider_job
    output, tmp_path = seen["output"], seen["tmp_path"]
    assert seen["forged"]
    assert seen["returncode"] == 0, output
    assert "ForgedByOutsider" not in output and "forged_op" not in output
    assert all((tmp_path / f"done{r}").exists() for r in range(2))
    # Said at debug level, once per process (each rank read the forgery on many ticks).
    ignored = output.count("Cadence's watchdog ignored a record")
    assert 1 <= ignored <= 2, output


@needs_list_keys
def test_the_same_forgery_signed_with_the_job_token_does_stop_it(tmp_path):
    """Control: the forged record above is the one the watchdog acts on when it carries a valid
    signature, so the previous test shows the signature check, not a record the watchdog ignores anyway."""
    job = _start_job(tmp_path, {"LEAK_TOKEN_FOR_CONTROL": "1"})
    try:
        ranks = _wait_for_ranks(tmp_path, job)
        store = _outsider_store(ranks[0]["port"])
        _forge(store, _watch_prefix(store), RecordSigner(ranks[0]["token"].encode()))
    finally:
        output = _finish(job, tmp_path)
    assert job.returncode != 0
    assert "because rank 1 failed: ForgedByOutsider" in output, output


def test_records_verify_only_under_their_own_key_and_token():
    signer = RecordSigner(b"a" * 32)
    sealed = signer.sign("cadence/watch/run/0/0//stop", '{"kind": "failed"}')
    assert signer.open("cadence/watch/run/0/0//stop", sealed) == '{"kind": "failed"}'
    assert signer.open("cadence/watch/run/0/0//stop", sealed.encode()) == '{"kind": "failed"}'
    # Replayed under another key (another rank, an earlier generation), altered, or another job's.
    assert signer.open("cadence/watch/run/0/1//stop", sealed) is None
    assert signer.open("cadence/watch/run/0/0//stop", sealed.replace("failed", "report")) is None
    assert RecordSigner(b"b" * 32).open("cadence/watch/run/0/0//stop", sealed) is None
    for junk in ('{"kind": "failed"}', "", ".", "é" * 70 + '.{"a": 1}', b"\xff\xfe.{}"):
        assert signer.open("cadence/watch/run/0/0//stop", junk) is None
    # No token (plain torchrun, your own process group): records are not signed and not checked.
    unsigned = RecordSigner(None)
    assert unsigned.sign("k", "{}") == "{}" and unsigned.open("k", "{}") == "{}"


NOTEBOOK = textwrap.dedent(
    """
    import json, os, sys
    from cadence import notebook_launcher

    def train(out):
        from cadence import Accelerator
        acc = Accelerator(cpu=True)
        info = {"port": int(os.environ["MASTER_PORT"]), "token": os.environ.get("CADENCE_JOB_TOKEN"),
                "listening": open("/proc/net/tcp").read() + open("/proc/net/tcp6").read()}
        open(f"{out}/nb{acc.process_index}.json", "w").write(json.dumps(info))
        acc.wait_for_everyone()

    if __name__ == "__main__":
        notebook_launcher(train, (sys.argv[1],), num_processes=2, use_port=sys.argv[2])
    """
)


def test_notebook_launcher_workers_share_a_fresh_token_and_a_loopback_store(tmp_path):
    from harness import free_port

    (tmp_path / "nb.py").write_text(NOTEBOOK)
    env = {k: v for k, v in os.environ.items() if k != JOB_TOKEN_ENV}
    env["CUDA_VISIBLE_DEVICES"] = ""  # two gloo workers on any machine
    tokens = []
    for _ in range(2):
        result = subprocess.run(
            [sys.executable, "nb.py", str(tmp_path), str(free_port())], cwd=tmp_path, env=env,
            capture_output=True, text=True, timeout=180,
        )  # fmt: skip
        assert result.returncode == 0, result.stderr[-3000:]
        runs = [json.loads((tmp_path / f"nb{r}.json").read_text()) for r in range(2)]
        assert runs[0]["token"] == runs[1]["token"] and len(runs[0]["token"]) == 64
        listening = []
        for line in runs[0]["listening"].splitlines():
            fields = line.split()
            if len(fields) > 3 and ":" in fields[1] and fields[3] == "0A":
                address, hex_port = fields[1].split(":")
                if int(hex_port, 16) == runs[0]["port"]:
                    listening.append(address)
        assert listening == ["0100007F"], listening  # 127.0.0.1
        tokens.append(runs[0]["token"])
    assert tokens[0] != tokens[1]  # a new job, a new token


DIFFERENT_TOKENS = textwrap.dedent(
    """
    import os, sys, time, torch
    if os.environ["RANK"] == "1":  # as if this machine had been given another secret
        os.environ["CADENCE_JOB_TOKEN"] = "another-secret-" + "1" * 32
    from cadence import Accelerator
    from cadence.utils import broadcast_object_list

    out = sys.argv[1]
    acc = Accelerator(cpu=True)
    if acc.process_index == 1:
        while not os.path.exists(f"{out}/release"):
            time.sleep(0.05)
    acc.gather(torch.ones(1))
    """
)


def test_ranks_with_different_tokens_are_told_so(tmp_path):
    from harness import free_port

    (tmp_path / "job.py").write_text(DIFFERENT_TOKENS)
    env = dict(
        os.environ, OMP_NUM_THREADS="1", CADENCE_STALL_REPORT="1", CADENCE_STUCK_TIMEOUT="600"
    )
    env[JOB_TOKEN_ENV] = "first-secret-" + "0" * 32
    job = subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2",
         f"--master_port={free_port()}", "job.py", str(tmp_path)],
        cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True,
    )  # fmt: skip
    lines: list[str] = []

    def read() -> None:  # in a thread, so that the wait below has a time limit
        for line in job.stdout:
            lines.append(line)
            if "record verifies with this rank's CADENCE_JOB_TOKEN" in line:
                (tmp_path / "release").write_text("")

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        job.wait(timeout=120)
    except subprocess.TimeoutExpired:
        _stop(job)
        raise AssertionError("the job did not end:\n" + "".join(lines)) from None
    reader.join(timeout=30)
    output = "".join(lines)
    assert job.returncode == 0, output
    assert output.count("no other rank's watchdog record verifies") == 1, output
    assert "Give every machine the same CADENCE_JOB_TOKEN (or none)" in output
