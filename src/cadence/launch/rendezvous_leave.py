"""A node leaving torch elastic's c10d rendezvous on purpose, so the others need not wait for it.

When a node stops (a stop notice), torch's agent leaves the rendezvous state as it is: the node stays
a participant until its heartbeats are missed `keep_alive_max_attempt` times, and only then can the
other nodes' next round complete without it. Leaving takes the node out at once with torch's own
state operations (those a node runs when its join times out): out of the participants, the wait
list or the redundancy list, whichever holds it, under the handler's heartbeat lock, heartbeats
stopped first. The rendezvous is not closed (torch's `shutdown()` would end the job for every node).

torch's dynamic rendezvous handler keeps these pieces private; `leave_rendezvous` uses them when
they are there and says so when they are not (the node is then dropped by heartbeat expiry, as
before).
"""

from __future__ import annotations

import time
from typing import Any

from torch.distributed.elastic.rendezvous import dynamic_rendezvous as _dynamic


class LeaveOp:
    """The state operation of a node that leaves: one removal, then done (torch's op protocol)."""

    def __init__(self) -> None:
        self.round: int | None = None  # the round of the state this node was removed from

    def __call__(self, ctx: Any, deadline: float) -> Any:
        """The next action for this node, given the rendezvous state in `ctx`."""
        actions = _dynamic._Action
        state = ctx.state
        if ctx.node in state.participants:
            action = actions.REMOVE_FROM_PARTICIPANTS
        elif ctx.node in state.wait_list:
            action = actions.REMOVE_FROM_WAIT_LIST
        elif ctx.node in state.redundancy_list:
            action = actions.REMOVE_FROM_REDUNDANCY_LIST
        else:
            return actions.FINISH
        if time.monotonic() > deadline:
            return actions.ERROR_TIMEOUT
        self.round = state.round
        return action


def leave_rendezvous(handler: Any) -> tuple[int | None, str | None] | None:
    """Take this node out of `handler`'s rendezvous; returns (the round it left, or None when it was
    in none; why it could not, or None), or None for a rendezvous that is not dynamic (nothing to
    leave)."""
    if not isinstance(handler, _dynamic.DynamicRendezvousHandler):
        return None
    needed = ("_op_executor", "_stop_heartbeats", "_heartbeat_lock", "_get_deadline", "_settings")
    if not all(hasattr(handler, name) for name in needed):
        return None, "this torch release's handler has no such parts; heartbeat expiry drops it"
    handler._stop_heartbeats()
    op = LeaveOp()
    try:
        with handler._heartbeat_lock:
            deadline = handler._get_deadline(handler._settings.timeout.close)
            handler._op_executor.run(op, deadline)
    except Exception as error:  # noqa: BLE001 - the store's host may be gone: nothing to leave
        return None, f"{type(error).__name__}: {error}"
    return op.round, None
