"""`cadence lighthouse`: run torchft's Lighthouse for a fault-tolerant job across machines."""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from typing import Any


def register(subparsers: Any) -> None:
    """Add the `lighthouse` subcommand to `subparsers`."""
    parser = subparsers.add_parser(
        "lighthouse",
        help="Run the Lighthouse of a fault-tolerant job (torchft; see `cadence launch --fault_tolerance`).",
        description="Run torchft's Lighthouse, which forms the quorum of the replica groups of a "
        "fault-tolerant job, on one address. Start it once per job, then on each machine "
        "`cadence launch --fault_tolerance --lighthouse HOST:PORT --replica_group I ...`. It serves "
        "until SIGINT or SIGTERM.",
    )
    parser.add_argument("--bind", required=True, metavar="HOST:PORT",
                        help="Address to listen on (one interface; never every interface by default).")  # fmt: skip
    parser.add_argument("--min_replicas", type=int, default=1,
                        help="Fewest replica groups a quorum needs (default: 1).")  # fmt: skip
    parser.add_argument("--heartbeat_timeout", type=float, default=None,
                        help="Seconds without a heartbeat before a group counts as lost (default: 1).")  # fmt: skip
    parser.set_defaults(func=lighthouse_command)


def lighthouse_command(args: argparse.Namespace) -> int:
    """Serve until SIGINT or SIGTERM; bad input exits with code 2 before anything listens."""
    from ..fault_tolerance.config import (  # deferred: loaded when the command runs
        DEFAULT_HEARTBEAT_TIMEOUT,
        torchft_missing_message,
    )
    from ..launch.fault_tolerance import (  # deferred: loaded when the command runs
        start_lighthouse,
    )

    problems = []
    missing = torchft_missing_message("cadence lighthouse")
    if missing:
        problems.append(missing)
    host, _, port = args.bind.rpartition(":")
    if not host or not port.isdigit():
        problems.append(f"--bind {args.bind!r} must be HOST:PORT (e.g. 10.0.0.1:29510)")
    if args.min_replicas < 1:
        problems.append(f"--min_replicas must be 1 or more, got {args.min_replicas}")
    heartbeat = args.heartbeat_timeout or DEFAULT_HEARTBEAT_TIMEOUT
    if heartbeat <= 0:
        problems.append(f"--heartbeat_timeout must be more than 0 seconds, got {heartbeat}")
    if problems:
        print("cadence lighthouse cannot start:\n  - " + "\n  - ".join(problems), file=sys.stderr)
        return 2
    server, url = start_lighthouse(host.strip("[]"), int(port), args.min_replicas, heartbeat)
    print(f"cadence lighthouse: {url} (min_replicas {args.min_replicas}, heartbeat timeout "
          f"{heartbeat:g} s); Ctrl-C stops it", file=sys.stderr, flush=True)  # fmt: skip
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    while not stop.wait(1.0):  # bounded by the signal that ends the command
        pass
    server.shutdown()
    return 0
