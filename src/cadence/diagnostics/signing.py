"""Authenticate the watchdog's records: an HMAC of each record under a per-job secret.

The store the watchdog talks through is torch's TCPStore, which anyone who can reach its port may read
and write. So every record a rank writes is signed with HMAC-SHA256 of a per-job token that the
launcher hands to its workers through the environment (``CADENCE_JOB_TOKEN``), never through the store.
A record whose signature does not match (forged, altered, replayed under another key, or unsigned) is
ignored, and reported once per process at debug level.

Without a token in the environment (a job started by plain `torchrun` or by your own
`init_process_group`), records cannot be authenticated: they are written unsigned and accepted as they
are, exactly as torch trusts its own store. Export ``CADENCE_JOB_TOKEN`` (the same random value on every
rank) to get the protection there too.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import secrets

from ..core.settings import env_text

JOB_TOKEN_ENV = "CADENCE_JOB_TOKEN"
# A token shorter than this is too easy to guess; launchers generate 64 hex characters.
MIN_TOKEN_LENGTH = 16
_SEPARATOR = "."

logger = logging.getLogger("cadence.diagnostics")


def new_job_token() -> str:
    """A fresh random token for one job (256 bits, hex)."""
    return secrets.token_hex(32)


def token_problem(token: str) -> str | None:
    """Why `token` cannot be used as a job token, or None when it can."""
    if len(token) < MIN_TOKEN_LENGTH:
        return (
            f"{JOB_TOKEN_ENV} is {len(token)} characters long; it must be a random secret of at least "
            f"{MIN_TOKEN_LENGTH} characters (e.g. `python -c 'import secrets; print(secrets.token_hex(32))'`), "
            "the same on every machine, or unset so that the launcher makes one"
        )
    return None


class RecordSigner:
    """Signs and checks the records of one job; `key` None means "no token: records are unsigned"."""

    def __init__(self, key: bytes | None) -> None:
        self._key = key
        self._warned = False

    @classmethod
    def from_environment(cls) -> RecordSigner:
        """A signer keyed with the job token from the environment (none if unset)."""
        token = env_text(JOB_TOKEN_ENV, "") or ""
        return cls(token.encode() if token else None)

    @property
    def authenticates(self) -> bool:
        """Whether records are signed and checked (a key is set)."""
        return self._key is not None

    def _mac(self, key: str, payload: str) -> str:
        assert self._key is not None
        # The key is part of the message, so a record cannot be replayed under another rank's key or
        # an earlier generation's prefix.
        message = key.encode() + b"\x00" + payload.encode()
        return hmac.new(self._key, message, hashlib.sha256).hexdigest()

    def sign(self, key: str, payload: str) -> str:
        """The value to store under `key` for `payload` (a JSON text)."""
        if self._key is None:
            return payload
        return self._mac(key, payload) + _SEPARATOR + payload

    def open(self, key: str, value: str | bytes) -> str | None:
        """The payload of a stored value if its signature is right, else None (and one debug line)."""
        text = value.decode(errors="replace") if isinstance(value, bytes) else value
        if self._key is None:
            return text
        mac, separator, payload = text.partition(_SEPARATOR)
        if separator and hmac.compare_digest(mac.encode(), self._mac(key, payload).encode()):
            return payload
        if not self._warned:
            self._warned = True
            logger.debug(
                "Cadence's watchdog ignored a record under %r that is not signed with this job's token "
                "(forged, or written by another job); further ones are ignored silently.",
                key,
            )
        return None
