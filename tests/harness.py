"""Run test functions in N real processes joined by one gloo process group, kept alive across tests.

Usage (through the `dist_pool` fixture of conftest.py)::

    def check_gather():                  # module level, so the workers can import it
        from cadence import Accelerator
        acc = Accelerator()
        return acc.gather(torch.tensor([acc.process_index])).tolist()

    def test_gather(dist_pool):
        assert dist_pool(2).run(check_gather) == [[0, 1], [0, 1]]   # one result per rank

The workers are CPU workers (gloo; they see no GPU, even on a GPU machine). Each worker sets the torchrun
environment (RANK, WORLD_SIZE, LOCAL_RANK, ...) and creates the gloo group
once; Cadence adopts it. Before every call the worker forgets Cadence's state (`reset_state()`), so each
test starts from a fresh `Accelerator()`. A call that raises on any rank raises `WorkerError` with every
failing rank's traceback; a call that does not finish within `timeout` kills the pool (the next `run`
starts a fresh one) and raises `WorkerTimeout`. Workers are forked from a server that has already
imported torch, so a pool of N costs about one torch import, not N.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import secrets
import socket
import sys
import time
import traceback
from collections.abc import Callable
from typing import Any

_CONTEXT = mp.get_context("forkserver")
_CONTEXT.set_forkserver_preload(
    ["torch", "torch.distributed", "cadence.state", "cadence.runtime.collectives"]
)


class WorkerError(AssertionError):
    """A function raised on at least one rank."""


class WorkerTimeout(AssertionError):
    """A function did not finish on every rank in time (the pool was killed)."""


def load_script(path: Any, name: str) -> Any:
    """The Python file at `path` as a module named `name` (registered in sys.modules, where
    dataclasses look their module up), without running it as a script."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _worker_main(
    rank: int, world_size: int, port: int, token: str, sys_path: list[str], conn: Any
) -> None:
    sys.path[:] = sys_path
    # The pool is a CPU pool: its workers see no GPU (set before anything asks CUDA), so on a GPU machine
    # `Accelerator()` in a worker trains on the CPU exactly as in CI, and 2 ranks never share one GPU.
    # CUDA tests run in the test process or in their own subprocesses instead.
    os.environ["CUDA_VISIBLE_DEVICES"] = ""
    if world_size > 1:
        os.environ.update(
            # As cadence launch does: the watchdog signs its records with a per-pool secret.
            CADENCE_JOB_TOKEN=token,
            RANK=str(rank),
            WORLD_SIZE=str(world_size),
            LOCAL_RANK=str(rank),
            LOCAL_WORLD_SIZE=str(world_size),
            GROUP_RANK="0",
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
        )
    import datetime

    import torch
    import torch.distributed as dist

    from cadence.state import reset_state

    torch.set_num_threads(1)
    if world_size > 1:
        dist.init_process_group(
            "gloo", rank=rank, world_size=world_size, timeout=datetime.timedelta(seconds=120)
        )
    base_env = dict(os.environ)
    while True:
        message = conn.recv()
        if message is None:
            break
        function, args, kwargs, extra_env = message
        os.environ.clear()
        os.environ.update(base_env)
        os.environ.update(extra_env)
        # A pool of one has no group of its own; a group Cadence started for one call (FSDP at world
        # size 1) goes with that call's state.
        reset_state(destroy_process_group=world_size == 1)
        try:
            conn.send(("ok", function(*args, **kwargs)))
        except BaseException as error:  # noqa: BLE001 - report everything to the parent
            conn.send(("error", f"{type(error).__name__}: {error}", traceback.format_exc()))
    if world_size > 1 and dist.is_initialized():
        dist.destroy_process_group()


class WorkerPool:
    def __init__(self, world_size: int) -> None:
        self.world_size = world_size
        self._processes: list[Any] = []
        self._conns: list[Any] = []

    def _start(self) -> None:
        port = free_port()
        token = secrets.token_hex(32)
        for rank in range(self.world_size):
            parent, child = _CONTEXT.Pipe()
            process = _CONTEXT.Process(
                target=_worker_main,
                args=(rank, self.world_size, port, token, list(sys.path), child),
                daemon=True,
            )
            process.start()
            self._processes.append(process)
            self._conns.append(parent)

    def run(
        self,
        function: Callable[..., Any],
        *args: Any,
        timeout: float = 120,
        env: dict[str, str] | None = None,
        **kwargs: Any,
    ) -> list[Any]:
        """Call `function(*args, **kwargs)` on every rank; return the per-rank results in rank order."""
        if not self._processes:
            self._start()
        for conn in self._conns:
            conn.send((function, args, kwargs, env or {}))
        deadline = time.monotonic() + timeout
        replies: list[Any] = [None] * self.world_size
        pending = set(range(self.world_size))
        while pending:
            if time.monotonic() > deadline or any(
                not self._processes[r].is_alive() for r in pending
            ):
                self.close(force=True)
                done = {r: replies[r] for r in range(self.world_size) if r not in pending}
                errors = _format_errors(done)
                raise WorkerTimeout(
                    f"{function.__name__} did not finish on ranks {sorted(pending)} within {timeout}s "
                    f"(or a worker died).{errors}"
                )
            for rank in list(pending):
                if self._conns[rank].poll(0.01):
                    replies[rank] = self._conns[rank].recv()
                    pending.discard(rank)
                    if replies[rank][0] == "error":
                        # The others may now wait forever in a collective: give them a moment only.
                        deadline = min(deadline, time.monotonic() + 15)
        if any(reply[0] == "error" for reply in replies):
            raise WorkerError(
                f"{function.__name__} failed:{_format_errors(dict(enumerate(replies)))}"
            )
        return [reply[1] for reply in replies]

    def close(self, force: bool = False) -> None:
        for conn, process in zip(self._conns, self._processes):
            if not force:
                try:
                    conn.send(None)
                except OSError:
                    pass
                process.join(timeout=5)
            if process.is_alive():
                process.kill()
                process.join(timeout=5)
        self._processes, self._conns = [], []


def _format_errors(replies: dict[int, Any]) -> str:
    parts = []
    for rank, reply in sorted(replies.items()):
        if reply is not None and reply[0] == "error":
            parts.append(f"\n--- rank {rank}: {reply[1]}\n{reply[2]}")
    return "".join(parts)
