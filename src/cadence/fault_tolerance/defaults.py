"""The default timeouts of fault tolerance, in a module of their own: the launcher's `--help`
shows them without importing torch (tests/test_cli_env.py)."""

from __future__ import annotations

DEFAULT_HEARTBEAT_TIMEOUT = 1.0
DEFAULT_QUORUM_TIMEOUT = 60.0
