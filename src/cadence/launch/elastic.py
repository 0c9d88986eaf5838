"""The elastic part of a launch plan: torchrun's node range, processes per node, rendezvous settings,
and the exact `torch.distributed.run` arguments of the plan.

`--nnodes MIN:MAX` makes the job elastic (torch elastic's c10d rendezvous): the agents restart the
workers on the new world size when a node leaves or joins. torch's rendezvous defaults bring a job
back only ~47 s after a node's death (3 missed 5-s heartbeats, then a 30-s last call); Cadence's
defaults below bring it back in ~8 s on a shared 2-core machine (benchmarks/bench_elastic_restart.py),
and `--rdzv_conf key=value` overrides each.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..runtime import hardware
from .settings import DEFAULT, FLAG, LaunchPlanError, Setting

# Rendezvous settings of an elastic launch (seconds): a node is declared dead after 3 missed 1-s
# heartbeats, and a new round waits 2 s for late nodes before it starts. `--rdzv_conf` overrides each.
ELASTIC_RDZV_DEFAULTS = {
    "keep_alive_interval": "1",
    "keep_alive_max_attempt": "3",
    "last_call_timeout": "2",
    "join_timeout": "600",
}
# torch 2.13: when a node joins after the first round, the old rank 0 keeps reusing the agent's TCP
# store and never publishes the new round's master address, so the new round can wait 60 s. With this
# set, every round gets its own store from the workers' rank 0.
SHARED_STORE_SWITCH = "TORCH_DISABLE_SHARE_RDZV_TCP_STORE"


def parse_node_range(text: str) -> tuple[int, int]:
    """`"2"` -> (2, 2), `"1:4"` -> (1, 4); raises LaunchPlanError for anything else."""
    low, sep, high = str(text).strip().partition(":")
    try:
        pair = (int(low), int(high if sep else low))
    except ValueError:
        raise LaunchPlanError(
            f"--nnodes {text!r} must be a number of nodes or MIN:MAX (e.g. --nnodes 1:2)"
        ) from None
    if pair[0] < 1 or pair[1] < pair[0]:
        raise LaunchPlanError(
            f"--nnodes {text!r}: need 1 <= MIN <= MAX (e.g. --nnodes 1:2 for one to two nodes)"
        )
    return pair


def apply_node_range(settings: dict[str, Setting], errors: list[str], notes: list[str]) -> int:
    """Turn torchrun's `--nnodes` / `--nproc_per_node` into Accelerate's settings, in place.

    `num_machines` becomes the most nodes; `num_processes` the total over that many nodes. With a
    fixed node count, Accelerate's `--num_processes` keeps its meaning (the total); with a range
    the total varies, so `--num_processes` alone counts the processes of each node. Returns the
    fewest nodes (the node count when the job is not elastic).
    """
    machines = settings["num_machines"]
    per_node = settings["nproc_per_node"].value
    nnodes = settings["nnodes"].value
    low = high = machines.value
    if nnodes is not None:
        try:
            low, high = parse_node_range(nnodes)
        except LaunchPlanError as err:
            errors.append(str(err))
            return max(1, machines.value)
        if machines.source != DEFAULT and machines.value != high:
            errors.append(
                f"--nnodes {nnodes} and --num_machines {machines.value} ({machines.source}) disagree; "
                "pass only one"
            )
        settings["num_machines"] = Setting(high, f"{settings['nnodes'].source} (--nnodes {nnodes})")
    total = settings["num_processes"]
    if per_node is None and total.value is not None and low != high:
        per_node = total.value
        notes.append(
            f"with --nnodes {nnodes}, --num_processes {total.value} counts the processes of each "
            "node (the total changes with the nodes); --nproc_per_node says it explicitly"
        )
    elif per_node is not None and total.value is not None and total.value != per_node * high:
        errors.append(
            f"--num_processes {total.value} ({total.source}) is the total over all nodes and "
            f"disagrees with --nproc_per_node {per_node} x {high} node(s); pass only one"
        )
    if per_node is not None:
        if per_node < 1:
            errors.append(f"--nproc_per_node must be at least 1, got {per_node}")
        else:
            source = settings["nproc_per_node"].source
            settings["num_processes"] = Setting(per_node * high, f"{source} (per node x nodes)")
    if low != high:
        backend = settings["rdzv_backend"]
        if backend.source == DEFAULT:
            settings["rdzv_backend"] = Setting("c10d", "default: --nnodes MIN:MAX (elastic)")
        elif backend.value == "static":
            errors.append(
                f"--nnodes {nnodes} (elastic) needs a dynamic rendezvous: --rdzv_backend c10d"
            )
    return low


def apply_rdzv_endpoint(settings: dict[str, Setting], errors: list[str]) -> None:
    """torchrun's `--rdzv_endpoint HOST:PORT` sets the main process address and port."""
    endpoint = settings["rdzv_endpoint"].value
    if not endpoint:
        return
    host, sep, port = str(endpoint).rpartition(":")
    if not sep or not host or not port.isdigit():
        errors.append(
            f"--rdzv_endpoint {endpoint!r} must be HOST:PORT (e.g. --rdzv_endpoint 10.0.0.1:29500)"
        )
        return
    source = settings["rdzv_endpoint"].source
    for name, value in (("main_process_ip", host.strip("[]")), ("main_process_port", int(port))):
        given = settings[name]
        if given.source == FLAG and given.value != value:
            errors.append(f"--rdzv_endpoint {endpoint} and --{name} {given.value} disagree")
        settings[name] = Setting(value, f"{source} (--rdzv_endpoint)")


def is_loopback(host: str | None) -> bool:
    """Whether `host` names this machine's loopback (several local "nodes" on one machine)."""
    if host in ("localhost",):
        return True
    try:
        return ipaddress.ip_address(str(host)).is_loopback
    except ValueError:
        return False


def rendezvous_conf(user_conf: Mapping[str, str], elastic: bool) -> dict[str, str]:
    """The `--rdzv_conf` handed to torch: Cadence's elastic defaults under the user's values."""
    if not elastic:
        return dict(user_conf)
    return {**ELASTIC_RDZV_DEFAULTS, **user_conf}


# torch's c10d rendezvous reads a boolean option with these spellings (any case), and refuses others.
TRUE_SPELLINGS = ("1", "true", "t", "yes", "y")
FALSE_SPELLINGS = ("0", "false", "f", "no", "n")


def parse_rdzv_bool(key: str, text: str) -> bool:
    """`--rdzv_conf key=text` as torch's c10d rendezvous reads a boolean; raises LaunchPlanError."""
    if text.strip().lower() in TRUE_SPELLINGS:
        return True
    if text.strip().lower() in FALSE_SPELLINGS:
        return False
    raise LaunchPlanError(
        f"--rdzv_conf {key}={text!r} is not a boolean: pass {key}=1 (this node hosts the "
        f"rendezvous store) or {key}=0 (another node hosts it); torch also accepts "
        f"{'/'.join(TRUE_SPELLINGS[1:])} and {'/'.join(FALSE_SPELLINGS[1:])}"
    )


@dataclass(frozen=True)
class StoreRole:
    """Whether this launcher hosts the job's rendezvous store, where, and why.

    `address` None: another launcher hosts it and this one connects. `must_host`: this launcher
    alone may host it (a port already taken is an error, not a cue to connect); False only for the
    local nodes' rule, where the first launcher on the port hosts and the others connect.
    """

    address: str | None
    must_host: bool
    reason: str
    remedy: str = ""


def store_role(plan: Any, user_conf: Mapping[str, str], conf: Mapping[str, str]) -> StoreRole:
    """Who hosts the rendezvous store of `plan`: `user_conf` is the user's `--rdzv_conf`, `conf` the
    one handed to torch (`rendezvous_conf_for`).

    An explicit `is_host` always wins (as in torch's c10d rendezvous); without one, several local
    elastic nodes on a loopback endpoint share the rule "the first launcher on the port hosts it".
    """
    ip, backend = plan.value("main_process_ip"), plan.value("rdzv_backend")
    if plan.num_machines == 1:
        return StoreRole(
            "127.0.0.1",
            True,
            "one machine: this launcher hosts it",
            "pass another --main_process_port, or 0 for a free one",
        )
    if backend == "static":
        if plan.value("machine_rank") != 0:
            return StoreRole(None, False, "machine rank 0 hosts it")
        return StoreRole(
            ip,
            True,
            "machine rank 0 hosts it",
            "give the other machines' launchers their own --machine_rank, or pick a free "
            "--main_process_port",
        )
    if backend != "c10d":
        return StoreRole(None, False, f"the {backend} rendezvous backend keeps its own store")
    if "is_host" in user_conf:
        text = user_conf["is_host"]
        if not parse_rdzv_bool("is_host", text):
            return StoreRole(None, False, f"another node hosts it: is_host={text} in --rdzv_conf")
        return StoreRole(
            ip,
            True,
            f"this node hosts it: is_host={text} in --rdzv_conf",
            "only one node hosts the store: start the other nodes' launchers with is_host=0, "
            "or pick a free port in --rdzv_endpoint",
        )
    if "is_host" in conf:  # decided by routing (rendezvous_conf_for)
        if conf["is_host"] != "1":
            return StoreRole(None, False, "another machine has the endpoint's address")
        return StoreRole(
            ip,
            True,
            "this machine has the endpoint's address",
            "pick a free port in --rdzv_endpoint, or pass is_host=0 in --rdzv_conf to the "
            "launchers that must not host it",
        )
    if plan.elastic and is_loopback(ip):
        return StoreRole("127.0.0.1", False, "local nodes: the first launcher on the port hosts it")
    return StoreRole(None, False, "torch decides from the endpoint's host name")


def rendezvous_conf_for(plan: Any, user_conf: Mapping[str, str]) -> dict[str, str]:
    """The `--rdzv_conf` handed to torch: Cadence's elastic defaults under the user's values, and
    `is_host` decided by routing when several machines do not say who hosts the store."""
    conf = rendezvous_conf(user_conf, plan.min_nodes != plan.num_machines)
    if plan.value("rdzv_backend") == "static" or plan.num_machines <= 1 or "is_host" in conf:
        return conf
    ip, port = plan.value("main_process_ip"), plan.value("main_process_port")
    # Several local elastic "nodes" on one machine: every launcher would claim the store by
    # routing; leaving is_host unset lets the first launcher on the port host it (store_role).
    if plan.min_nodes != plan.num_machines and is_loopback(ip):
        return conf
    local = hardware.local_address_towards(ip, port)
    # Decide who hosts the rendezvous store by routing, not by hostname (which may resolve to
    # 127.0.0.1 on every machine inside containers or network namespaces).
    if local is not None:
        conf["is_host"] = "1" if local == ip else "0"
    return conf


def torchrun_args(plan: Any, conf: Mapping[str, str]) -> list[str]:
    """The exact `torch.distributed.run` arguments of `plan` (its flags after resolution); `conf` is
    the rendezvous configuration from `rendezvous_conf_for`."""
    value = plan.value
    ip, port = value("main_process_ip"), value("main_process_port")
    nodes = (
        f"{plan.min_nodes}:{plan.num_machines}"
        if plan.min_nodes != plan.num_machines
        else str(plan.num_machines)
    )
    args = [
        "--nnodes", nodes,
        "--nproc_per_node", str(plan.nproc_per_node),
        "--rdzv_backend", value("rdzv_backend"),
        "--max_restarts", str(value("max_restarts")),
        "--monitor_interval", str(value("monitor_interval")),
        "--role", value("role"),
        "--tee", str(value("tee")),
    ]  # fmt: skip
    if value("rdzv_backend") == "static":
        args += ["--node_rank", str(value("machine_rank")), "--master_addr", ip]
        args += ["--master_port", str(port)]
    else:
        args += ["--rdzv_endpoint", f"{ip}:{port}", "--rdzv_id", "none"]
    if plan.num_machines > 1:
        local = hardware.local_address_towards(ip, port)
        if local is not None:
            args += ["--local_addr", local]
    if conf:
        args += ["--rdzv_conf", ",".join(f"{k}={v}" for k, v in conf.items())]
    if value("log_dir"):
        args += ["--log_dir", value("log_dir")]
    if plan.no_python:
        args += ["--no_python", plan.script, *plan.script_args]
    else:
        args += ["--module", *plan.worker_argv()[3:]]
    return args


def elastic_worker_env(plan: Any) -> dict[str, str]:
    """Variables every worker (and the agent) of a dynamic-rendezvous launch gets."""
    if plan.value("rdzv_backend") == "static":
        return {}
    return {SHARED_STORE_SWITCH: "1"}
