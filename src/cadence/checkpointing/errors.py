"""Errors raised by the checkpoint storage layer.

Every message names the checkpoint folder, the file and what is wrong, so a user who sees one
knows whether to pick another checkpoint, re-save, or (for pickles) opt in explicitly.
"""

from __future__ import annotations

import os


class CheckpointError(ValueError):  # the reference raises ValueError for unusable folders
    """A checkpoint folder cannot be used. `problems` lists one line per file that is wrong."""

    def __init__(self, message: str, *, path: str | os.PathLike | None = None, problems=()):
        super().__init__(message)
        self.path = None if path is None else os.fspath(path)
        self.problems = list(problems)


class CheckpointIncompleteError(CheckpointError):
    """The save never finished: the manifest or a file it lists is missing."""


class NoCheckpointError(CheckpointIncompleteError, FileNotFoundError):
    """No complete checkpoint to resume from (also a FileNotFoundError, what was raised before)."""


class CheckpointCorruptError(CheckpointError):
    """The checkpoint was committed but a file changed since: wrong size, wrong checksum, unreadable."""


class UnsafeCheckpointError(CheckpointError):
    """A file holds Python objects that can only be restored by unpickling, and no opt-in was given."""


class CheckpointMismatchError(CheckpointError, RuntimeError):
    """A saved state does not fit the object it would be loaded into (keys, shapes, dtypes, param
    groups, layout). Raised before any object is changed. It is also a RuntimeError, the type
    torch's load_state_dict raises for the same problems."""


class CheckpointCommitError(CheckpointError):
    """Committing failed: a process did not finish writing its part, or two processes wrote one file."""


def describe_problems(header: str, problems: list[str]) -> str:
    """One message: a header line, then each problem on its own indented line."""
    return header + "".join(f"\n  - {p}" for p in problems)


class SharedVerificationError(CheckpointError, RuntimeError):
    """The processes verifying a checkpoint together could not agree: another process failed or
    died during the verification. Nothing of the checkpoint was applied."""
