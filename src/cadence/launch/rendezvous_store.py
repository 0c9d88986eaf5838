"""Host the job's rendezvous store on one address instead of every interface.

torch's TCPStore server listens on all interfaces (``::``) whatever host name it is given. The launcher
therefore opens the listening socket itself, bound to the address the workers will use (127.0.0.1 for a
one-machine job, the main process address on the main machine of several), and starts a multi-tenant
TCPStore server on it *before* torch elastic's rendezvous creates its own store on the same port: a
multi-tenant TCPStore reuses the server already running on its port in this process, so the agent's
store, and the workers' connections to it, go through the socket bound here.
"""

from __future__ import annotations

import errno
import ipaddress
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

from ..core.torch_compat import tcpstore_listen_fd_options


def resolve_address(host: str) -> str | None:
    """The numeric address of `host` (itself when it is numeric already), or None."""
    try:
        return str(ipaddress.ip_address(host))
    except ValueError:
        pass
    try:
        return socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)[0][4][0]
    except (OSError, IndexError, UnicodeError):
        return None


def bound_listener(address: str, port: int) -> socket.socket:
    """A TCP socket listening on `address`:`port` only (raises OSError when this machine lacks it)."""
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((address, port))
        sock.listen(2048)
    except OSError:
        sock.close()
        raise
    return sock


class StorePortTakenError(OSError):
    """The store's port is taken on its address while this launcher must host the store."""

    def __init__(self, address: str, port: int):
        super().__init__(errno.EADDRINUSE, f"{address}:{port} is already in use")
        self.address, self.port = address, port


@contextmanager
def store_bound_to(
    host: str, port: int, other_machines: bool = False, must_host: bool = False
) -> Iterator[tuple[Any, str | None]]:
    """Within this block, a TCPStore server for `port` runs in this process on `host`'s address only.

    Yields (the store, None), or (None, why not) when the address is not one of this machine's (a
    NAT-ed main address), or is a loopback address other machines must reach (a host name that resolves
    to 127.0.1.1 here): torch then hosts the store as it would without Cadence. With `must_host`, a
    port something else already listens on raises StorePortTakenError (torch could not host it
    either); without, it yields (None, why not) and this launcher connects to that store.
    """
    from torch.distributed import TCPStore

    address = resolve_address(host)
    if address is None:
        yield None, f"{host!r} does not resolve to an address"
        return
    if other_machines and ipaddress.ip_address(address).is_loopback:
        yield None, f"{host!r} resolves to {address} here, which the other machines cannot reach"
        return
    try:
        listener = bound_listener(address, port)
    except OSError as error:
        if must_host and error.errno == errno.EADDRINUSE:
            raise StorePortTakenError(address, port) from None
        yield None, f"cannot listen on {address}:{port} ({error.strerror or error})"
        return
    # The store owns the socket from here (detach: Python must never close it under the server).
    store = TCPStore(
        address,
        port,
        None,
        True,
        timedelta(seconds=60),
        wait_for_workers=False,
        multi_tenant=True,
        master_listen_fd=listener.detach(),
        **tcpstore_listen_fd_options(),  # torch 2.7: libuv takes no listening socket
    )
    try:
        yield store, None
    finally:
        del store
