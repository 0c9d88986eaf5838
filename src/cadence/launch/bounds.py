"""Sane upper and lower bounds for every numeric `cadence launch` setting, checked before anything starts.

A typo such as ``--num_processes 100000000000000000000`` must not make torch elastic build worker
specs until memory runs out: every count, port, interval and timeout is checked here, whichever layer
(flag, ``CADENCE_<FLAG>`` environment variable, config file) it came from, and each problem says what is
wrong and what to do.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

# Processes per machine on CPU: more than this many per core only thrashes (unless --oversubscribe).
PROCESSES_PER_CORE = 8
# Whatever --oversubscribe says: one launcher cannot reasonably supervise more workers than this.
MAX_PROCESSES_PER_MACHINE = 4096
MAX_TOTAL_PROCESSES = 1 << 20
MAX_THREADS_PER_PROCESS = 4096
MAX_RESTARTS = 1000
MAX_MONITOR_INTERVAL = 3600.0
MAX_GRADIENT_ACCUMULATION_STEPS = 1_000_000
MAX_INT64 = (1 << 63) - 1
# Watchdog delays given through the environment: a week is far beyond any sane collective.
MAX_WATCH_SECONDS = 7 * 24 * 3600.0


def _source(settings: Mapping[str, Any], name: str) -> str:
    return settings[name].source


def process_count_problems(
    settings: Mapping[str, Any], nproc_per_node: int, on_gpu: bool, cores: int
) -> list[str]:
    """Upper bounds of the process counts (the lower bounds are checked with the plan itself)."""
    problems = []
    total = settings["num_processes"].value
    machines = settings["num_machines"].value
    oversubscribe = bool(settings["oversubscribe"].value)
    if total > MAX_TOTAL_PROCESSES:
        problems.append(
            f"--num_processes {total} ({_source(settings, 'num_processes')}) is more than "
            f"{MAX_TOTAL_PROCESSES} processes in all; it is the TOTAL over all machines, e.g. "
            "--num_processes 16 for 2 machines of 8"
        )
    if machines > MAX_TOTAL_PROCESSES:
        problems.append(
            f"--num_machines {machines} ({_source(settings, 'num_machines')}) is more than "
            f"{MAX_TOTAL_PROCESSES} machines; pass the number of machines in the job"
        )
    if problems or on_gpu or total < 1 or machines < 1:
        return problems  # on GPU the count is bounded by the GPUs (checked with the plan)
    per_core = cores * PROCESSES_PER_CORE
    if nproc_per_node > MAX_PROCESSES_PER_MACHINE:
        problems.append(
            f"{nproc_per_node} processes per machine (--num_processes {total} over {machines} "
            f"machine(s)) is more than one launcher can supervise ({MAX_PROCESSES_PER_MACHINE}, even "
            "with --oversubscribe); lower --num_processes or add machines"
        )
    elif nproc_per_node > per_core and not oversubscribe:
        problems.append(
            f"{nproc_per_node} processes per machine (--num_processes {total}, "
            f"{_source(settings, 'num_processes')}) is more than {PROCESSES_PER_CORE} per CPU core "
            f"here ({cores} core(s), at most {per_core}); lower --num_processes, or pass "
            "--oversubscribe if you really want that many"
        )
    return problems


def value_problems(settings: Mapping[str, Any], env: Mapping[str, str]) -> list[str]:
    """Bounds of the other numeric settings and of the watchdog's environment variables."""
    problems = []

    def value(name: str) -> Any:
        return settings[name].value

    def out_of(name: str, low: Any, high: Any, what: str) -> None:
        number = value(name)
        if number is None:
            return
        if not (isinstance(number, (int, float)) and low <= number <= high):
            problems.append(
                f"--{name} {number!r} ({_source(settings, name)}) must be {what} "
                f"(between {low} and {high})"
            )

    threads = value("num_cpu_threads_per_process")
    if threads is not None and threads > MAX_THREADS_PER_PROCESS:
        problems.append(
            f"--num_cpu_threads_per_process {threads} ({_source(settings, 'num_cpu_threads_per_process')}) "
            f"is more than {MAX_THREADS_PER_PROCESS} threads per process; give about the number of "
            "cores divided by the processes per machine"
        )
    out_of("max_restarts", 0, MAX_RESTARTS, "a number of restarts")
    interval = value("monitor_interval")
    if isinstance(interval, float) and math.isfinite(interval) and interval > MAX_MONITOR_INTERVAL:
        problems.append(
            f"--monitor_interval {interval:g} ({_source(settings, 'monitor_interval')}) is more than "
            f"{MAX_MONITOR_INTERVAL:g} s between health checks; the default is 0.1"
        )
    out_of(
        "gradient_accumulation_steps",
        1,
        MAX_GRADIENT_ACCUMULATION_STEPS,
        "a number of steps",
    )
    if settings["use_fsdp"].value:
        out_of("fsdp_min_num_params", 0, MAX_INT64, "a number of parameters")
    clipping = value("gradient_clipping")
    if (
        settings["use_deepspeed"].value
        and clipping is not None
        and not (math.isfinite(clipping) and clipping >= 0)
    ):
        problems.append(
            f"--gradient_clipping {clipping!r} must be a finite number, 0 or more (e.g. 1.0)"
        )
    problems += watch_setting_problems(env)
    return problems


def watch_setting_problems(env: Mapping[str, str]) -> list[str]:
    """The watchdog's settings from the environment, which every worker inherits: check them once here
    rather than let each worker fail at start-up."""
    from ..diagnostics.settings import (  # deferred: loaded when the command runs (keeps `cadence --help` fast)
        STALL_REPORT_ENV,
        STUCK_TIMEOUT_ENV,
        parse_seconds,
    )
    from ..diagnostics.signing import (  # deferred: loaded when the command runs (keeps `cadence --help` fast)
        JOB_TOKEN_ENV,
        token_problem,
    )

    problems = []
    for name in (STUCK_TIMEOUT_ENV, STALL_REPORT_ENV):
        raw = env.get(name)
        if raw is None or raw == "":
            continue
        try:
            parse_seconds(raw, name, upper=MAX_WATCH_SECONDS)
        except ValueError as error:
            problems.append(f"environment variable {error}")
    token = env.get(JOB_TOKEN_ENV)
    if token is not None and token != "" and token_problem(token):
        problems.append(str(token_problem(token)))
    return problems


OVERSUBSCRIBE_ENV = "CADENCE_OVERSUBSCRIBE"


def notebook_launcher_problems(
    num_processes: int,
    num_nodes: Any,
    node_rank: Any,
    port: Any,
    max_restarts: Any,
    monitor_interval: Any,
    gpus: int,
    cores: int,
    oversubscribe: bool,
) -> list[str]:
    """What is wrong with notebook_launcher's / debug_launcher's numbers (empty when all is well)."""
    problems = []

    def is_int(value: Any) -> bool:
        return isinstance(value, int) and not isinstance(value, bool)

    if not is_int(num_nodes) or not 1 <= num_nodes <= MAX_TOTAL_PROCESSES:
        problems.append(f"num_nodes must be a number of machines, 1 or more, got {num_nodes!r}")
    elif not is_int(node_rank) or not 0 <= node_rank < num_nodes:
        problems.append(f"node_rank must be in [0, {num_nodes}), got {node_rank!r}")
    try:
        port_number = int(str(port))
    except ValueError:
        port_number = -1
    if not 0 <= port_number <= 65535:
        problems.append(f"use_port must be a TCP port (0-65535), got {port!r}")
    if not is_int(max_restarts) or not 0 <= max_restarts <= MAX_RESTARTS:
        problems.append(f"max_restarts must be between 0 and {MAX_RESTARTS}, got {max_restarts!r}")
    if (
        not isinstance(monitor_interval, (int, float))
        or isinstance(monitor_interval, bool)
        or not 0 < monitor_interval <= MAX_MONITOR_INTERVAL
    ):
        problems.append(
            f"monitor_interval must be a number of seconds in (0, {MAX_MONITOR_INTERVAL:g}], "
            f"got {monitor_interval!r}"
        )
    if gpus > 0:
        if num_processes > gpus:
            problems.append(
                f"num_processes={num_processes} needs {num_processes} GPUs on this machine but "
                f"{gpus} are visible; pass num_processes={gpus} or fewer"
            )
    elif num_processes > MAX_PROCESSES_PER_MACHINE:
        problems.append(
            f"num_processes={num_processes} is more than one launcher can supervise "
            f"({MAX_PROCESSES_PER_MACHINE} per machine, even with {OVERSUBSCRIBE_ENV}=1)"
        )
    elif num_processes > cores * PROCESSES_PER_CORE and not oversubscribe:
        problems.append(
            f"num_processes={num_processes} is more than {PROCESSES_PER_CORE} processes per CPU core "
            f"here ({cores} core(s), at most {cores * PROCESSES_PER_CORE}); pass fewer, or set "
            f"{OVERSUBSCRIBE_ENV}=1 if you really want that many"
        )
    return problems
