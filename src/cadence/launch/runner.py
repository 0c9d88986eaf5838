"""Start a launch plan: one process directly, several through torch elastic; report failures.

The multi-process path runs `torch.distributed.run`'s own launcher in this process (its argument
parser, `config_from_args` and `elastic_launch`), so the agent that supervises the workers, restarts
them and stops them on a signal is PyTorch's. Cadence only adds the worker bootstrap (which records
each worker's exception) and the root-cause summary.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

from ..core.torch_compat import torchrun_signal_args
from ..diagnostics.failure_report import (
    WorkerFailure,
    failures_from_elastic,
    format_failure_summary,
)
from ..diagnostics.signing import JOB_TOKEN_ENV, new_job_token
from ..diagnostics.stop_notice import RESUME_EXIT_CODE, stop_signal
from .elastic import is_loopback
from .plan import LaunchPlan

FORWARDED_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)


def _say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def run_plan(plan: LaunchPlan) -> int:
    """Run the plan to completion; returns the launcher's exit code."""
    if plan.multi_process:
        return _run_elastic(plan)
    return _run_single(plan)


def job_token_environment(plan: LaunchPlan) -> dict[str, str]:
    """The secret the workers' watchdogs sign their records with, handed over in the environment only.

    One machine: a fresh random token per launch (unless CADENCE_JOB_TOKEN is set). Several machines
    must share one, and nothing but the store connects their launchers, so the user's
    CADENCE_JOB_TOKEN is used when set; without it the records are not authenticated (said once).
    """
    if os.environ.get(JOB_TOKEN_ENV):
        return {JOB_TOKEN_ENV: os.environ[JOB_TOKEN_ENV]}
    if plan.num_machines == 1:
        return {JOB_TOKEN_ENV: new_job_token()}
    if not plan.value("quiet"):
        _say(
            f"cadence launch: {JOB_TOKEN_ENV} is not set, so the watchdog cannot authenticate its "
            "records across machines; set it to the same random secret on every machine "
            "(python -c 'import secrets; print(secrets.token_hex(32))')"
        )
    return {}


def _run_single(plan: LaunchPlan) -> int:
    with tempfile.TemporaryDirectory(prefix="cadence-launch-") as scratch:
        error_file = os.path.join(scratch, "error.json")
        env = {
            **os.environ,
            **plan.worker_env,
            **job_token_environment(plan),
            "TORCHELASTIC_ERROR_FILE": error_file,
        }
        # Own session, so a terminal's Ctrl-C reaches the worker once (forwarded below), not twice.
        worker = subprocess.Popen(plan.worker_argv(), env=env, start_new_session=True)
        received: list[int] = []

        def forward(signum: int, _frame: object) -> None:
            received.append(signum)
            if worker.poll() is None:
                worker.send_signal(signum)

        previous = {sig: signal.signal(sig, forward) for sig in FORWARDED_SIGNALS}
        try:
            exitcode = worker.wait()
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        if exitcode == 0:
            return 0
        if received:
            _say(f"cadence launch: stopped by {signal.Signals(received[0]).name}")
            return 128 + received[0]
        data = None
        if os.path.isfile(error_file):
            try:
                data = json.loads(Path(error_file).read_text(encoding="utf-8"))
            except (OSError, ValueError):
                data = None
        failure = WorkerFailure(
            rank=0, local_rank=0, exitcode=exitcode, pid=worker.pid, error_data=data
        )
        _say(format_failure_summary([failure], local_ranks=[0], verbose=plan.value("debug")))
        return exitcode if exitcode > 0 else 128 - exitcode


def _quiet_torch_elastic(debug: bool) -> None:
    # torch elastic logs every failure as a large table; the summary below replaces it unless --debug.
    if not debug:
        logging.getLogger("torch.distributed.elastic").setLevel(logging.CRITICAL)


def _run_elastic(plan: LaunchPlan) -> int:
    os.environ.update(plan.worker_env)
    os.environ.update(job_token_environment(plan))
    role = plan.store
    if role is None or role.address is None:  # another launcher hosts the store: connect to it
        return _run_elastic_agent(plan)
    from .rendezvous_store import (  # deferred: imports torch.distributed
        StorePortTakenError,
        store_bound_to,
    )

    port = plan.value("main_process_port")
    # A loopback endpoint: every node is on this machine, so the store listens there only.
    other_machines = plan.num_machines > 1 and not is_loopback(role.address)
    try:
        with store_bound_to(role.address, port, other_machines, role.must_host) as (store, why):
            # Without must_host (local nodes), a port taken by the first launcher: connect to it.
            if store is None and not plan.value("quiet") and role.must_host:
                _say(
                    f"cadence launch: the rendezvous store listens on every interface: {why} "
                    "(see README, 'The rendezvous store')"
                )
            return _run_elastic_agent(plan)
    except StorePortTakenError as taken:
        _say(
            f"cadence launch: cannot host the rendezvous store on {taken.address}:{taken.port} "
            f"({role.reason}): another launcher already holds that port; {role.remedy}"
        )
        return 1


def _run_elastic_agent(plan: LaunchPlan) -> int:
    import torch.distributed.run as torchrun
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import elastic_launch

    _quiet_torch_elastic(plan.value("debug"))
    user_log_dir = plan.value("log_dir")
    scratch = None if user_log_dir else tempfile.TemporaryDirectory(prefix="cadence-launch-")
    from .elastic_agent import (  # deferred: imports torch elastic
        SupervisingAgent,
        supervising_agent,
    )

    args = list(plan.torchrun_args)
    if scratch is not None:
        args = ["--log_dir", scratch.name, *args]
    notice = stop_signal()  # a bad CADENCE_STOP_SIGNAL is refused before anything starts
    handled = "SIGTERM,SIGINT,SIGHUP,SIGQUIT"
    names = [*handled.split(","), *([notice.name] if notice is not None else [])]
    args = [*torchrun_signal_args(list(dict.fromkeys(names))), *args]  # torch < 2.10: the agent
    try:
        config, entrypoint, entry_args = torchrun.config_from_args(torchrun.parse_args(args))
        try:
            with supervising_agent():
                elastic_launch(config=config, entrypoint=entrypoint)(*entry_args)
        except ChildFailedError as error:
            agent = SupervisingAgent.latest
            failures = failures_from_elastic(error, agent.stopped if agent else {})
            base = failures[0].rank - failures[0].local_rank
            local_ranks = [base + i for i in range(plan.nproc_per_node)]
            _say(
                format_failure_summary(
                    failures, local_ranks, user_log_dir, verbose=plan.value("debug")
                )
            )
            return 1
        except SignalException as stop:
            name = signal.Signals(stop.sigval).name
            agent = SupervisingAgent.latest
            if agent is not None and agent.stopped_to_resume:
                cause = (
                    f"rank {agent.noticed_ranks[0]} got the stop notice ({name})"
                    if agent.noticed_ranks
                    else f"stopped by {name}"
                )
                _say(
                    f"cadence launch: {cause}; the workers committed a checkpoint; "
                    f"exit code {RESUME_EXIT_CODE}: start the job again to resume"
                )
                return RESUME_EXIT_CODE
            _say(f"cadence launch: stopped by {name}; all workers were stopped")
            return 128 + int(stop.sigval)
        except Exception as error:  # rendezvous or agent failure: the workers never ran to the end
            if plan.value("debug"):
                raise
            _say(
                f"cadence launch: torch elastic could not run the workers: {type(error).__name__}: "
                f"{error}\n  (pass --debug for the full traceback)"
            )
            return 1
        return 0
    finally:
        if scratch is not None:
            scratch.cleanup()
