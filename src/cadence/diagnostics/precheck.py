"""Make sure every rank is about to run the same collective on compatible inputs, before it runs.

On gloo a size mismatch kills the process (SIGABRT from a backend thread) and different collectives
hang, so on gloo every Cadence collective first exchanges a 4-number handshake (one tiny all-reduce;
for a barrier the handshake *is* the barrier). When the handshakes differ, every rank saw the same table,
so every rank then swaps the details (operation, shapes, call site) and raises the same error.
In debug mode (`CADENCE_DEBUG=1`, `cadence launch --debug`) every backend swaps the full details first.
On NCCL without debug mode the watchdog reports mismatches instead (they hang there rather than crash).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from ..core.settings import env_bool
from .errors import DistributedOperationException
from .signature import describe_inputs, operation_code, signature_hash

MAGIC = 0x0CAD5EC7

# The handshake costs a tiny all-reduce per collective (2-3x the latency of a 1 KB gather on gloo), so
# it is opt-in: CADENCE_HANDSHAKE=1, or debug mode (which compares full details instead). Without it,
# diverging collectives are still stopped and reported by the watchdog (CADENCE_LEDGER=0 switches all
# diagnostics off).
handshake_enabled = env_bool("CADENCE_HANDSHAKE", False)


def _uses_gloo(state: Any) -> bool:
    return "gloo" in str(state.backend or "")


def check_collective(
    entry: Any, state: Any, signature: str | None = None, arguments: str = ""
) -> bool:
    """Raise `DistributedOperationException` on every rank if the ranks disagree about this call.

    `signature` replaces the description of the inputs when the collective allows different shapes
    (pad_across_processes, gather_object); `arguments` holds settings that must match too (reduction,
    source rank). Returns True when the check itself synchronised the ranks (a handshake ran).
    """
    if entry.nested or not state.use_distributed:
        return False
    if state.debug:
        _compare_details(entry, state, signature, arguments)
        return True
    if handshake_enabled and entry.sequence and _uses_gloo(state):
        _handshake(entry, state, signature, arguments)
        return True
    return False


def _agreed_text(entry: Any, signature: str | None, arguments: str) -> str:
    if signature is None:
        signature = "" if entry.inputs is None else describe_inputs(entry.inputs, limit=None)
    return f"{signature}|{arguments}"


def _handshake(entry: Any, state: Any, signature: str | None, arguments: str) -> None:
    # One all-reduce (MAX) of [v, -v] gives every rank the largest and smallest handshake at once:
    # they are equal exactly when every rank sent the same (and all ranks conclude the same).
    text = _agreed_text(entry, signature, arguments)
    mine = [MAGIC, operation_code(entry.operation), entry.sequence, signature_hash(text)]
    extremes = torch.tensor(mine + [-value for value in mine], dtype=torch.int64)
    dist.all_reduce(extremes, op=dist.ReduceOp.MAX)
    values = extremes.tolist()
    largest, smallest = values[:4], [-value for value in values[4:]]
    if largest == smallest:
        return
    if largest[0] != smallest[0]:
        # A rank is in a collective of its own (not a handshake): it would not join the swap below.
        raise DistributedOperationException(
            f"[rank {state.process_index}] {entry.operation} (call #{entry.sequence} at "
            f"{entry.call_site()}) met a rank in a collective that Cadence did not start (a direct "
            "torch.distributed call?). Every rank must run the same collectives in the same order."
        )
    _compare_details(entry, state, signature, arguments)


def _compare_details(entry: Any, state: Any, signature: str | None, arguments: str) -> None:
    text = _agreed_text(entry, signature, arguments)
    mine = {
        "operation": entry.operation,
        "sequence": entry.sequence,
        "agreed": text,
        "inputs": entry.describe_inputs() if signature is None else signature,
        "arguments": arguments,
        "site": entry.call_site(),
    }
    everyone: list[Any] = [None] * state.num_processes
    dist.all_gather_object(everyone, mine)
    keys = [(e["operation"], e["sequence"], e["agreed"]) for e in everyone]
    if all(key == keys[0] for key in keys):
        return
    raise DistributedOperationException(mismatch_message(state.process_index, entry, everyone))


def mismatch_message(rank: int, entry: Any, everyone: list[dict[str, Any]]) -> str:
    """The report of a collective the ranks disagree on (different calls, or out of step)."""
    lines = []
    for other, info in enumerate(everyone):
        arguments = f" with {info['arguments']}" if info["arguments"] else ""
        lines.append(
            f"  rank {other}: {info['operation']} {info['inputs']}{arguments} "
            f"(call #{info['sequence']} at {info['site']})"
        )
    operations = {info["operation"] for info in everyone}
    sequences = {info["sequence"] for info in everyone}
    if len(operations) > 1:
        problem = "the ranks called different collectives"
        advice = (
            "Every rank must call the same collectives in the same order; look for a collective "
            "that only some ranks reach (inside an `if` on the rank, or after a rank-dependent loop)."
        )
    elif len(sequences) > 1:
        problem = "the ranks are out of step"
        advice = "Some ranks made more Cadence collective calls than others before this one."
    elif len({info["arguments"] for info in everyone}) > 1:
        problem = "the ranks passed different arguments"
        advice = "Every rank must pass the same reduction / source rank."
    else:
        problem = "the ranks passed incompatible inputs"
        advice = _shape_advice(entry.operation)
    return (
        f"[rank {rank}] Cannot run {entry.operation} (call #{entry.sequence}): {problem} "
        "(operation, shapes and dtypes, call site per rank):\n" + "\n".join(lines) + f"\n{advice}"
    )


def _shape_advice(operation: str) -> str:
    if operation == "pad_across_processes":
        return "pad_across_processes needs tensors with the same number of dimensions everywhere."
    if operation in ("gather", "reduce", "broadcast"):
        return (
            f"{operation} needs the same structure, shapes and dtypes on every rank. Make every rank "
            "pass tensors of the same shape (see pad_across_processes, or gather_for_metrics)."
        )
    return "Every rank must pass the same kind of input."
