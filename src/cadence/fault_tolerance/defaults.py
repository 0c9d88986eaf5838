"""The default timeouts of fault tolerance, in a module of their own: the launcher's `--help`
shows them without importing torch (tests/test_cli_env.py)."""

from __future__ import annotations

DEFAULT_HEARTBEAT_TIMEOUT = 1.0
DEFAULT_QUORUM_TIMEOUT = 60.0
# While every group trains, a step reuses the last quorum and every this many steps asks the
# Lighthouse again (session.py says why a failure needs no quorum to be noticed).
DEFAULT_QUORUM_EVERY = 16
