"""`cadence launch --fault_tolerance`: torchft's Lighthouse and the replica groups around it.

On one machine (`--replica_groups G`) the launcher binds a Lighthouse to the machine's address and
starts G replica groups, each its own `cadence launch` (its own torch elastic job, store and
SupervisingAgent, so a group whose process dies is restarted by its own agent while the others keep
training). Across machines, `cadence lighthouse --bind HOST:PORT` runs the Lighthouse and
`cadence launch --fault_tolerance --lighthouse HOST:PORT --replica_group I` runs group I. Each group's
workers find their settings in the launch record (`fault_tolerance`), which `Accelerator()` reads.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import time
from typing import Any

from ..core.settings import LAUNCH_CONFIG_ENV, encode_launch_config
from ..fault_tolerance.config import (
    DEFAULT_HEARTBEAT_TIMEOUT,
    DEFAULT_MAX_RESTARTS,
    DEFAULT_QUORUM_EVERY,
    DEFAULT_QUORUM_TIMEOUT,
    SUPPORTED_INSIDE_A_GROUP,
    FaultToleranceConfig,
    check_fields,
    torchft_missing_message,
)
from ..runtime import hardware
from .args import build_launch_parser
from .banner import format_banner, format_dry_run
from .fault_tolerance_flags import FT_FLAGS, wants_fault_tolerance_flags
from .plan import build_plan
from .runner import run_plan
from .settings import LaunchPlanError

# The Lighthouse forms a quorum every tick. A forming quorum waits up to JOIN_TIMEOUT_MS for groups
# that are alive (heartbeating) but have not asked to join yet: a slow step, a restarted group still
# starting. It is long on purpose: a group that is alive but slower than it would otherwise form a
# quorum of its own at the same step as the others' (torchft heals only a group that is behind), and
# both would commit that step on their own cursors, training the same samples twice. A dead group
# stops heartbeating and is dropped after the heartbeat timeout, without this wait.
QUORUM_TICK_MS = 100
JOIN_TIMEOUT_MS = 30_000


def wants_fault_tolerance(args: argparse.Namespace) -> bool:
    """Whether `args` asks for fault tolerance (any of its flags given)."""
    return wants_fault_tolerance_flags(args)


def _say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def lighthouse_url(address: str) -> str:
    """`HOST:PORT` or `http://HOST:PORT` as torchft's clients take it."""
    return address if address.startswith("http") else f"http://{address}"


def start_lighthouse(
    host: str,
    port: int,
    min_replicas: int,
    heartbeat_timeout: float,
    quorum_timeout: float = DEFAULT_QUORUM_TIMEOUT,
) -> tuple[Any, str]:
    """torchft's LighthouseServer bound to `host:port` (0: any free port); returns it and its URL.

    The join wait stays under half the groups' quorum timeout, so a group waiting for a slow peer
    never fails its own quorum first."""
    from torchft.coordination import LighthouseServer

    server = LighthouseServer(
        bind=f"{host}:{port}",
        min_replicas=min_replicas,
        join_timeout_ms=int(min(JOIN_TIMEOUT_MS, quorum_timeout * 500)),
        quorum_tick_ms=QUORUM_TICK_MS,
        heartbeat_timeout_ms=int(heartbeat_timeout * 1000),
    )
    bound_port = int(server.address().rsplit(":", 1)[1])  # it names the host by its hostname
    return server, f"http://{host}:{bound_port}"


def _take(args: argparse.Namespace) -> dict[str, Any]:
    found = {name: vars(args).pop(name) for name in FT_FLAGS if name in vars(args)}
    found.setdefault("min_replicas", 1)
    found.setdefault("heartbeat_timeout", DEFAULT_HEARTBEAT_TIMEOUT)
    found.setdefault("quorum_timeout", DEFAULT_QUORUM_TIMEOUT)
    found.setdefault("quorum_every", DEFAULT_QUORUM_EVERY)
    return found


def _check(ft: dict[str, Any], args: argparse.Namespace | None = None) -> None:
    problems = []
    given = vars(args) if args is not None else {}
    if ft.get("fault_tolerance"):
        # FSDP2 shards inside each group (replicated across groups: HSDP); FSDP1 and DeepSpeed
        # are refused here, and again by the worker's Accelerator for a config file's settings.
        if given.get("use_fsdp") and str(given.get("fsdp_version") or 1) != "2":
            problems.append(
                "--use_fsdp with --fault_tolerance needs --fsdp_version 2 (FSDP version 1 is not "
                f"supported): inside a replica group Cadence supports {SUPPORTED_INSIDE_A_GROUP}"
            )
        if given.get("use_deepspeed"):
            problems.append(
                "--use_deepspeed with --fault_tolerance: inside a replica group Cadence supports "
                f"{SUPPORTED_INSIDE_A_GROUP} (DeepSpeed is not supported)"
            )
    missing = torchft_missing_message("--fault_tolerance")
    if missing:
        problems.append(missing)
    if not ft.get("fault_tolerance"):
        given = ", ".join(f"--{name}" for name in ft if name in FT_FLAGS[1:4])
        if given:
            problems.append(f"{given} need --fault_tolerance")
    if "lighthouse" in ft:
        if "replica_group" not in ft:
            problems.append("--lighthouse needs --replica_group I (the group this launcher runs)")
    elif ft.get("fault_tolerance"):
        if "replica_group" in ft:
            problems.append(
                "--replica_group runs one group of a job whose Lighthouse runs elsewhere: pass "
                "--lighthouse HOST:PORT too (or --replica_groups G alone to run every group here)"
            )
        if "replica_groups" not in ft:
            problems.append(
                "--fault_tolerance needs --replica_groups G (all groups on this machine) or "
                "--lighthouse HOST:PORT --replica_group I (one group of a job across machines)"
            )
    if ft.get("fault_tolerance"):
        config = FaultToleranceConfig.__new__(FaultToleranceConfig)  # checked below, not built
        for name, value in _config_fields(ft, "http://x").items():
            setattr(config, name, value)
        problems.extend(f"--{p}" for p in check_fields(config) if not p.startswith("lighthouse"))
    if problems:
        raise LaunchPlanError(
            "cadence launch cannot start:\n  - "
            + "\n  - ".join(problems)
            + "\nNothing was started."
        )


def _config_fields(ft: dict[str, Any], lighthouse: str, host: str = "127.0.0.1") -> dict[str, Any]:
    return {
        "lighthouse": lighthouse,
        "replica_group": ft.get("replica_group", 0),
        "replica_groups": ft.get("replica_groups"),
        "min_replicas": ft["min_replicas"],
        "heartbeat_timeout": ft["heartbeat_timeout"],
        "quorum_timeout": ft["quorum_timeout"],
        "quorum_every": ft["quorum_every"],
        "timeout": 10.0,
        "host": host,
    }


def fault_tolerant_launch(args: argparse.Namespace, dry_run: bool) -> int:
    """Run `cadence launch` with fault tolerance (the Lighthouse and every group, or one group)."""
    ft = _take(args)
    _check(ft, args)
    # torchft's Rust servers log every quorum at INFO; the quorum changes Cadence reports are the
    # lines that matter (set RUST_LOG=info, or pass --debug, to see torchft's own).
    os.environ.setdefault("RUST_LOG", "info" if vars(args).get("debug") else "warn")
    if "lighthouse" in ft:
        return _run_group(args, ft, dry_run)
    return _run_groups(args, ft, dry_run)


def _machine_host(args: argparse.Namespace) -> str:
    return str(vars(args).get("main_process_ip") or "127.0.0.1")


def _run_group(args: argparse.Namespace, ft: dict[str, Any], dry_run: bool) -> int:

    if "max_restarts" not in vars(args):  # a group's agent restarts its workers by default
        args.max_restarts = DEFAULT_MAX_RESTARTS
    plan = build_plan(args)
    config = FaultToleranceConfig(
        **_config_fields(ft, lighthouse_url(ft["lighthouse"]), _machine_host(args))
    )
    plan.record["fault_tolerance"] = config.to_record()
    plan.worker_env[LAUNCH_CONFIG_ENV] = encode_launch_config(plan.record)
    line = (
        f"cadence launch: replica group {config.replica_group}"
        + (f" of {config.replica_groups}" if config.replica_groups else "")
        + f", Lighthouse {config.lighthouse}, max_restarts {plan.value('max_restarts')}"
    )
    if dry_run:
        print(format_dry_run(plan) + "\n" + line)
        return 0
    if not plan.value("quiet"):
        _say(format_banner(plan) + "\n" + line)
    return run_plan(plan)


def _free_ports(host: str, count: int) -> list[int]:
    """`count` distinct free ports of `host`: every probe stays bound until all are chosen, so the
    system cannot hand the same port to two groups' stores."""
    probes = []
    try:
        for _ in range(count):
            probe = socket.socket()
            probes.append(probe)
            probe.bind((host, 0))
        return [int(probe.getsockname()[1]) for probe in probes]
    finally:
        for probe in probes:
            probe.close()


def _flag_argv(args: argparse.Namespace) -> list[str]:
    """The typed launcher flags of `args` (the parser's SUPPRESS keeps the others out) as argv."""

    parser, _ = build_launch_parser(lambda **options: argparse.ArgumentParser(**options))
    actions = {action.dest: action for action in parser._actions if action.option_strings}
    argv: list[str] = []
    for name, value in vars(args).items():
        if name in ("training_script", "training_script_args", "main_process_port"):
            continue
        action = actions.get(name)
        if action is None:
            continue
        if action.nargs == 0:
            if value:
                argv.append(action.option_strings[0])
        elif value is not None:
            argv += [action.option_strings[0], str(value)]
    return argv


def _threads_argv(args: argparse.Namespace, groups: int) -> list[str]:
    """`--num_cpu_threads_per_process` for each group's launcher when the threads are left to the
    default on CPU: the machine's cores shared by every group's processes, not by one group's (each
    group's launcher alone would give its N processes cores / N threads each, G times too many)."""
    plan = build_plan(argparse.Namespace(**vars(args)))
    threads = plan.settings["num_cpu_threads_per_process"]
    if not str(threads.source).startswith("default: ") or plan.device.value != "cpu":
        return []
    cores = hardware.usable_cpu_count()
    return ["--num_cpu_threads_per_process", str(max(1, cores // (groups * plan.nproc_per_node)))]


def _run_groups(args: argparse.Namespace, ft: dict[str, Any], dry_run: bool) -> int:
    groups = int(ft["replica_groups"])
    host = _machine_host(args)
    flags = _flag_argv(args) + _threads_argv(args, groups)
    script = [args.training_script, *(getattr(args, "training_script_args", None) or [])]
    max_restarts = vars(args).get("max_restarts", DEFAULT_MAX_RESTARTS)
    summary = (
        f"cadence launch: fault tolerance (torchft): {groups} replica groups, min_replicas "
        f"{ft['min_replicas']}, heartbeat timeout {ft['heartbeat_timeout']:g} s, quorum timeout "
        f"{ft['quorum_timeout']:g} s, max_restarts {max_restarts} per group"
    )
    if dry_run:
        print(summary + f"\n  Lighthouse bound to {host} (port chosen at start)")
        return 0
    server, url = start_lighthouse(
        host, 0, ft["min_replicas"], ft["heartbeat_timeout"], ft["quorum_timeout"]
    )
    quiet = bool(vars(args).get("quiet"))
    if not quiet:
        _say(summary + f"\n  Lighthouse: {url} (bound to {host})")
    children = []
    ports = _free_ports(host, groups)
    try:
        for index in range(groups):
            argv = [
                sys.executable, "-m", "cadence.commands.cli", "launch",
                "--fault_tolerance", "--lighthouse", url,
                "--replica_group", str(index), "--replica_groups", str(groups),
                "--min_replicas", str(ft["min_replicas"]),
                "--heartbeat_timeout", str(ft["heartbeat_timeout"]),
                "--quorum_timeout", str(ft["quorum_timeout"]),
                "--quorum_every", str(ft["quorum_every"]),
                "--main_process_port", str(ports[index]),
                *(["--max_restarts", str(max_restarts)] if "max_restarts" not in vars(args) else []),
                *flags, *script,
            ]  # fmt: skip
            children.append(subprocess.Popen(argv, env=dict(os.environ)))
        return _wait(children, quiet)
    finally:
        for child in children:
            if child.poll() is None:
                child.terminate()
        for child in children:
            try:
                child.wait(timeout=30)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()
        server.shutdown()


def _wait(children: list[subprocess.Popen], quiet: bool) -> int:
    """Wait for every group; a signal to the launcher goes to every group's launcher."""
    received: list[int] = []

    def forward(signum: int, _frame: object) -> None:
        received.append(signum)
        for child in children:
            if child.poll() is None:
                child.send_signal(signum)

    handled = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    previous = {sig: signal.signal(sig, forward) for sig in handled}
    try:
        codes: dict[int, int] = {}
        while len(codes) < len(children):  # bounded by the groups' own lifetimes
            for index, child in enumerate(children):
                code = child.poll()
                if code is not None and index not in codes:
                    codes[index] = code
                    if code != 0 and not quiet:
                        _say(f"cadence launch: replica group {index} ended with exit code {code}")
            time.sleep(0.2)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if received:
        return 128 + received[0]
    failed = [code for code in codes.values() if code != 0]
    return failed[0] if failed else 0
