"""Validation of a checkpoint manifest before any of it is used.

A manifest comes from disk and may be damaged or hostile: every field is checked for type and
range, and every file name must be a relative path that stays inside the checkpoint folder. Any
violation raises CheckpointCorruptError (a CheckpointError), never OverflowError, RecursionError or
KeyError, so callers that fall back to an older checkpoint on CheckpointError keep working.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

MAX_MANIFEST_BYTES = 64 * 1024 * 1024
MAX_FILE_BYTES = 1 << 56  # 64 PiB: anything larger is a corrupt number, not a file
MAX_FILES = 1_000_000
MAX_NAME_CHARS = 4096
_HEX_RE = re.compile(r"^[0-9a-f]{1,256}$")
_ALGORITHM_RE = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


class ManifestSchemaError(ValueError):
    """One field of a manifest is malformed; the message names the field."""


def check_member_name(name: Any) -> str:
    """`name` if it is a relative '/'-separated path inside the folder, else ManifestSchemaError."""
    if not isinstance(name, str) or not name or len(name) > MAX_NAME_CHARS:
        raise ManifestSchemaError(f"file name {str(name)[:80]!r} is not a non-empty string")
    if "\x00" in name or "\\" in name:
        raise ManifestSchemaError(f"file name {name[:80]!r} contains a NUL or backslash")
    if name.startswith("/"):
        raise ManifestSchemaError(f"file name {name[:80]!r} is an absolute path")
    parts = name.split("/")
    if any(part in ("", ".", "..") for part in parts):
        raise ManifestSchemaError(
            f"file name {name[:80]!r} is not a plain relative path inside the folder "
            "(empty, '.' or '..' component)"
        )
    return name


def _int(data: dict, key: str, low: int, high: int, default: Any = ...) -> int:
    if key not in data:
        if default is ...:
            raise ManifestSchemaError(f"'{key}' is missing")
        return default
    value = data[key]
    if isinstance(value, bool) or not isinstance(value, int):
        raise ManifestSchemaError(f"'{key}' must be an integer, got {type(value).__name__}")
    if not low <= value <= high:
        raise ManifestSchemaError(f"'{key}' is {value}, outside [{low}, {high}]")
    return value


def _str(data: dict, key: str, default: Any = ..., limit: int = 4096) -> str:
    if key not in data:
        if default is ...:
            raise ManifestSchemaError(f"'{key}' is missing")
        return default
    value = data[key]
    if not isinstance(value, str) or len(value) > limit:
        raise ManifestSchemaError(f"'{key}' must be a string of at most {limit} characters")
    return value


def parse_manifest_json(text: str) -> Any:
    """json.loads that turns every parsing failure (deep nesting included) into ManifestSchemaError."""
    if len(text) > MAX_MANIFEST_BYTES:
        raise ManifestSchemaError(f"manifest is larger than {MAX_MANIFEST_BYTES} bytes")
    try:
        return json.loads(text)
    except RecursionError:
        raise ManifestSchemaError("manifest JSON is nested too deeply") from None
    except (ValueError, OverflowError, MemoryError) as e:
        raise ManifestSchemaError(f"manifest is not valid JSON ({e})") from None


def validate_manifest(
    data: Any, format_name: str, format_version: int
) -> tuple[int, dict[str, tuple[int, str]], dict[str, Any]]:
    """Check a parsed manifest; return (format version, {name: (size, checksum)}, other fields)."""
    if not isinstance(data, dict):
        raise ManifestSchemaError(f"manifest must be a JSON object, got {type(data).__name__}")
    if data.get("format") != format_name:
        raise ManifestSchemaError(
            f"'format' is {str(data.get('format'))[:80]!r}, expected {format_name!r}"
        )
    version = _int(data, "format_version", 1, 1 << 31)
    if version > format_version:
        raise ManifestSchemaError(
            f"format version {version} is newer than this Cadence understands "
            f"({format_version}); upgrade Cadence to load it"
        )
    files = data.get("files")
    if not isinstance(files, dict):
        raise ManifestSchemaError("'files' must be a JSON object of name -> {size, checksum}")
    if len(files) > MAX_FILES:
        raise ManifestSchemaError(f"'files' lists more than {MAX_FILES} files")
    records: dict[str, tuple[int, str]] = {}
    for name, record in files.items():
        check_member_name(name)
        if not isinstance(record, dict):
            raise ManifestSchemaError(f"entry of {name!r} must be an object with size and checksum")
        size = _int(record, "size", 0, MAX_FILE_BYTES)
        checksum = _str(record, "checksum", limit=256)
        if not _HEX_RE.match(checksum):
            raise ManifestSchemaError(f"checksum of {name!r} is not a lower-case hex digest")
        records[name] = (size, checksum)
    algorithm = _str(data, "checksum_algorithm", limit=64)
    if not _ALGORITHM_RE.match(algorithm):
        raise ManifestSchemaError(f"'checksum_algorithm' {algorithm[:64]!r} is not a valid name")
    world_size = _int(data, "world_size", 1, 1 << 24)
    ranks = data.get("ranks", [])
    if not isinstance(ranks, list) or len(ranks) > world_size:
        raise ManifestSchemaError("'ranks' must be a list of at most world_size process indices")
    for rank in ranks:
        if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < world_size:
            raise ManifestSchemaError(f"'ranks' holds {str(rank)[:40]}, not a rank < world_size")
    created = data.get("created", 0.0)
    if isinstance(created, bool) or not isinstance(created, (int, float)):
        raise ManifestSchemaError("'created' must be a number (seconds since the epoch)")
    if (isinstance(created, int) and abs(created) > 1 << 62) or not math.isfinite(float(created)):
        raise ManifestSchemaError("'created' must be a finite number")
    metadata = data.get("metadata", {})
    if not isinstance(metadata, dict):
        raise ManifestSchemaError("'metadata' must be a JSON object")
    other = {
        "checksum_algorithm": algorithm,
        "world_size": world_size,
        "ranks": list(ranks),
        "created": float(created),
        "cadence_version": _str(data, "cadence_version", "unknown", 200),
        "torch_version": _str(data, "torch_version", "unknown", 200),
        "metadata": metadata,
    }
    return version, records, other
