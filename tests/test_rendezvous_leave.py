"""A node leaving torch elastic's c10d rendezvous on purpose (launch/rendezvous_leave.py), on a real
TCP store with two real rendezvous handlers (two "nodes" in one process, each its own node id)."""

from __future__ import annotations

import pickle
import threading
from datetime import timedelta

import pytest
from torch.distributed import TCPStore
from torch.distributed.elastic.rendezvous import RendezvousParameters
from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import create_backend
from torch.distributed.elastic.rendezvous.dynamic_rendezvous import create_handler
from torch.distributed.elastic.rendezvous.static_tcp_rendezvous import StaticTCPRendezvous

from cadence.launch.rendezvous_leave import leave_rendezvous
from harness import free_port


def _handler(port: int):
    # Its own client of the store, as each node's agent has (one client blocks while it waits).
    store = TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=30))
    params = RendezvousParameters(
        backend="c10d",
        endpoint=f"127.0.0.1:{port}",
        run_id="leave-test",
        min_nodes=1,
        max_nodes=2,
        join_timeout="30",
        last_call_timeout="1",
        keep_alive_interval="1",
        keep_alive_max_attempt="3",
    )
    backend, _ = create_backend(params)
    handler = create_handler(store, backend, params)
    handler._backend_of_test = backend  # to read the shared state as it is in the store
    return handler


def _next_rounds(handlers) -> list:
    """Every handler joins the next round at once (threads, each bounded by the join timeout)."""
    results: list = [None] * len(handlers)

    def join(index: int) -> None:
        try:
            results[index] = handlers[index].next_rendezvous()
        except Exception as error:  # noqa: BLE001 - reported by the assertion below
            results[index] = error

    threads = [threading.Thread(target=join, args=(i,)) for i in range(len(handlers))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not any(thread.is_alive() for thread in threads), "a rendezvous never returned"
    return results


def test_a_node_that_leaves_lets_the_others_form_a_smaller_round_at_once():
    port = free_port()
    server = TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False)
    first, second = _handler(port), _handler(port)
    try:
        together = _next_rounds([first, second])
        assert [info.world_size for info in together] == [2, 2], together
        round_together = first._state_holder.state.round

        left, why_not = leave_rendezvous(second)
        assert why_not is None and left == round_together
        shared = pickle.loads(first._backend_of_test.get_state()[0])  # the store's state now
        assert second._this_node not in shared.participants
        assert second._this_node not in shared.last_heartbeats
        assert first._this_node in shared.participants and shared.round == round_together

        # The second handler is still alive in this process: without its leave, its node would stay
        # a participant and the first could never form a new round (it would wait in the wait list).
        (alone,) = _next_rounds([first])
        assert not isinstance(alone, Exception), alone
        assert alone.world_size == 1 and alone.rank == 0
        assert first._state_holder.state.round == round_together + 1
        # Leaving twice is harmless: the node is in no list any more.
        assert leave_rendezvous(second) == (None, None)
    finally:
        for handler in (first, second):
            handler._stop_heartbeats()
        del server


def test_a_static_rendezvous_has_nothing_to_leave():
    handler = StaticTCPRendezvous("127.0.0.1", free_port(), 0, 1, "static-test", 10)
    assert leave_rendezvous(handler) is None


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(pytest.main([__file__, "-q"]))
