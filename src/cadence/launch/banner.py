"""What `cadence launch` prints before starting: the short plan banner, and the full `--dry_run` report."""

from __future__ import annotations

import os
import shlex
import sys

from .plan import LaunchPlan


def _rendezvous_source(plan: LaunchPlan) -> str:
    backend, port = plan.settings["rdzv_backend"].source, plan.settings["main_process_port"].source
    if port == backend or (backend == "default" and port.startswith("default")):
        return port
    return f"{backend}; port: {port}"


def format_banner(plan: LaunchPlan) -> str:
    """One short summary of what will start and where each value came from."""
    value = plan.value
    rdzv = value("rdzv_backend")
    where = f"{value('main_process_ip')}:{value('main_process_port')}"
    rows = [
        (
            "processes",
            f"{plan.num_processes} ({plan.nproc_per_node} per machine)",
            plan.settings["num_processes"].source,
        ),
        (
            "machines",
            f"{plan.num_machines} (this is rank {value('machine_rank')})",
            plan.settings["num_machines"].source,
        ),
        ("device / backend", f"{plan.device.value} / {plan.backend}", plan.device.source),
        ("mixed precision", value("mixed_precision"), plan.settings["mixed_precision"].source),
        ("rendezvous", f"{rdzv} at {where}", _rendezvous_source(plan)),
        (
            "threads per process",
            str(value("num_cpu_threads_per_process")),
            plan.settings["num_cpu_threads_per_process"].source,
        ),
    ]
    if plan.num_machines > 1 and plan.store is not None:
        where = plan.store.address
        rows.append(
            ("rendezvous store", f"here on {where}" if where else "elsewhere", plan.store.reason)
        )
    if plan.distributed_type in ("FSDP", "DEEPSPEED"):
        rows.append(
            (
                "paradigm",
                plan.distributed_type,
                plan.settings[
                    "use_fsdp" if plan.distributed_type == "FSDP" else "use_deepspeed"
                ].source,
            )
        )
    if value("dynamo_backend") not in (None, "no"):
        rows.append(("dynamo", value("dynamo_backend"), plan.settings["dynamo_backend"].source))
    if plan.config_file:
        rows.append(("config file", plan.config_file, plan.settings["config_file"].source))
    width = max(len(r[0]) for r in rows)
    value_width = max(len(str(r[1])) for r in rows)
    lines = [f"cadence launch: {plan.distributed_type}"]
    lines += [
        f"  {label:<{width}}  {str(val):<{value_width}}  [{source}]" for label, val, source in rows
    ]
    lines += [f"  note: {note}" for note in plan.notes]
    return "\n".join(lines)


def format_dry_run(plan: LaunchPlan) -> str:
    """The plan, the exact per-worker command, and the equivalent torchrun command line."""
    lines = [format_banner(plan), "", "worker environment (added to the current one):"]
    lines += [f"  {key}={shlex.quote(val)}" for key, val in sorted(plan.worker_env.items())]
    # Never printed: the secret the watchdog signs its records with (see diagnostics/signing.py).
    if plan.num_machines == 1 or os.environ.get("CADENCE_JOB_TOKEN"):
        lines.append("  CADENCE_JOB_TOKEN=<secret, not shown>")
    lines += ["", "worker command:", f"  {shlex.join(plan.worker_argv())}", ""]
    if plan.multi_process:
        hosts = plan.store is not None and plan.store.address is not None
        store = (
            f"which hosts the rendezvous store on {plan.store.address} only"
            if hosts
            else f"which does not host the rendezvous store: {plan.store.reason}"
            if plan.store is not None
            else "which does not host the rendezvous store"
        )
        if hosts and not plan.store.must_host:
            store += ", unless another local node's launcher hosts it first"
        lines.append(
            f"started by torch elastic (in the launcher process, {store}), as this command would:"
        )
        lines.append(
            f"  {shlex.join([sys.executable, '-m', 'torch.distributed.run', *plan.torchrun_args])}"
        )
    else:
        lines.append("started directly as one process (no torch elastic).")
    return "\n".join(lines)
