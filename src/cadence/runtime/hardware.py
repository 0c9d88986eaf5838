"""What this machine offers (GPUs, CPU cores, network addresses), found without importing torch when possible."""

from __future__ import annotations

import os
import socket
import sys
from pathlib import Path

from .cuda_probe import cuda_device_count


def _gpu_driver_present() -> bool:
    if not sys.platform.startswith("linux"):
        return True  # no cheap check elsewhere: ask torch
    nvidia = Path("/proc/driver/nvidia/gpus")
    if nvidia.is_dir() and any(nvidia.iterdir()):
        return True
    return Path("/dev/nvidia0").exists() or Path("/dev/kfd").exists()


def visible_gpu_count() -> int:
    """GPUs torch can use here; imports torch only when a GPU driver is present."""
    if os.environ.get("CUDA_VISIBLE_DEVICES") == "" or not _gpu_driver_present():
        return 0
    # Through NVML: the CLI (and notebook code calling it) must not create a CUDA context.
    return cuda_device_count()


def usable_cpu_count() -> int:
    """CPU cores this process may run on (respects affinity masks and container limits)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:
        return max(1, os.cpu_count() or 1)


def local_address_towards(host: str, port: int) -> str | None:
    """The local IP address this machine uses to reach `host` (no packet is sent)."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect((host, port or 1))
            return probe.getsockname()[0]
    except OSError:
        return None


def interface_with_address(address: str) -> str | None:
    """The name of the network interface holding `address`, e.g. "eth0" (Linux only)."""
    try:
        import fcntl
        import struct
    except ImportError:
        return None
    siocgifaddr = 0x8915
    for _, name in socket.if_nameindex():
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            try:
                packed = fcntl.ioctl(
                    sock.fileno(), siocgifaddr, struct.pack("256s", name.encode()[:15])
                )
            except OSError:
                continue
        if socket.inet_ntoa(packed[20:24]) == address:
            return name
    return None


def free_port() -> int:
    """A TCP port nobody listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("", 0))
        return sock.getsockname()[1]


def port_in_use(port: int) -> bool:
    """Whether something on this machine already listens on TCP `port`."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(1.0)
        return sock.connect_ex(("127.0.0.1", port)) == 0
