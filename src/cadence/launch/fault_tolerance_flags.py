"""The launcher's fault-tolerance flags (their owner: cadence/launch/fault_tolerance.py).

A module of its own so that the launcher's parser (launch/args.py) imports it without importing
the launch plan.
"""

from __future__ import annotations

import argparse
from typing import Any

from ..fault_tolerance.defaults import (
    DEFAULT_HEARTBEAT_TIMEOUT,
    DEFAULT_QUORUM_EVERY,
    DEFAULT_QUORUM_TIMEOUT,
)

FT_FLAGS = (
    "fault_tolerance",
    "replica_groups",
    "replica_group",
    "lighthouse",
    "min_replicas",
    "heartbeat_timeout",
    "quorum_timeout",
    "quorum_every",
)


def add_fault_tolerance_flags(parser: argparse.ArgumentParser, add: Any) -> None:
    """The launcher's fault-tolerance flags (`add` adds both spellings of each)."""
    group = parser.add_argument_group("Fault tolerance (torchft; pip install 'cadence[ft]')")
    add(group, "--fault_tolerance", action="store_true",
        help="Train in replica groups that keep stepping when one fails (torchft).")  # fmt: skip
    add(group, "--replica_groups", type=int, metavar="G",
        help="Replica groups to start on this machine (with a Lighthouse), or the job's total.")  # fmt: skip
    add(group, "--replica_group", type=int, metavar="I",
        help="With --lighthouse: the index of the group this launcher runs.")  # fmt: skip
    add(group, "--lighthouse", metavar="HOST:PORT",
        help="The Lighthouse of a job across machines (see `cadence lighthouse`).")  # fmt: skip
    add(group, "--min_replicas", type=int,
        help="Fewest replica groups that may commit a step (default: 1).")  # fmt: skip
    add(group, "--heartbeat_timeout", type=float,
        help=f"Seconds without a heartbeat before a group counts as lost (default: {DEFAULT_HEARTBEAT_TIMEOUT:g}).")  # fmt: skip
    add(group, "--quorum_timeout", type=float,
        help=f"Seconds a step waits for a quorum before failing (default: {DEFAULT_QUORUM_TIMEOUT:g}).")  # fmt: skip
    add(group, "--quorum_every", type=int, metavar="N",
        help=f"While every group trains, ask for a new quorum every N steps (default: {DEFAULT_QUORUM_EVERY}; 1: every step).")  # fmt: skip


def wants_fault_tolerance_flags(args: argparse.Namespace) -> bool:
    """Whether `args` asks for fault tolerance (any of its flags given); here, so that a launch
    without it decides that without importing the fault-tolerance launcher (and torch)."""
    return any(name in vars(args) for name in FT_FLAGS)
