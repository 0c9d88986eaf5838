"""Turning user values into what a tracking library can store.

Configs often hold things no tracker can serialise (a `torch.dtype`, a path, a nested object). Rather
than letting the tracker raise mid-run, such values are converted to their text form with a warning
naming the key; nested dicts and lists are kept where the tracker can store them, flattened where not.
"""

from __future__ import annotations

import enum
import numbers
import os
import warnings
from collections.abc import Mapping
from typing import Any

_PLAIN = (bool, int, float, str, type(None))


def plain_number(value: Any) -> Any:
    """A one-element tensor or a NumPy scalar as a Python number; anything else unchanged."""
    if isinstance(value, _PLAIN):
        return value
    item = getattr(value, "item", None)
    size = getattr(value, "numel", None) or getattr(value, "size", None)
    if callable(item) and (size == 1 or (callable(size) and size() == 1)):
        try:
            return item()
        except (TypeError, ValueError, RuntimeError):
            return value
    return value


def plain_values(values: Mapping[str, Any]) -> dict[str, Any]:
    """`values` with one-element tensors and NumPy scalars (also inside nested dicts) as numbers."""
    return {
        key: plain_values(value) if isinstance(value, Mapping) else plain_number(value)
        for key, value in values.items()
    }


def storable_config(values: Mapping[str, Any], tracker_name: str) -> dict[str, Any]:
    """A JSON-like copy of `values`: dicts (string keys), lists and plain scalars.

    Tensors and NumPy scalars become numbers, enums their value, paths strings; any other object
    becomes its `str()` with a warning.
    """
    return _storable(dict(values), tracker_name, path="")


def flat_config(
    values: Mapping[str, Any], tracker_name: str, separator: str = "/"
) -> dict[str, Any]:
    """A `storable_config` result as one flat mapping of plain scalars, for trackers that store only
    scalars: nested dicts become `parent/child` keys, lists their text (with a warning)."""
    flat: dict[str, Any] = {}
    for key, value in values.items():
        _flatten_into(flat, str(key), value, tracker_name, separator)
    return flat


def _flatten_into(flat: dict[str, Any], key: str, value: Any, tracker: str, separator: str) -> None:
    if isinstance(value, dict):
        for child_key, child in value.items():
            _flatten_into(flat, f"{key}{separator}{child_key}", child, tracker, separator)
    elif isinstance(value, list):
        flat[key] = str(value)
        _warn_converted(tracker, key, value, "a list")
    else:
        flat[key] = value


def _storable(value: Any, tracker: str, path: str) -> Any:
    if isinstance(value, _PLAIN):
        return value
    if isinstance(value, Mapping):
        return {
            str(key): _storable(child, tracker, f"{path}.{key}" if path else str(key))
            for key, child in value.items()
        }
    if isinstance(value, (list, tuple)):
        return [_storable(child, tracker, f"{path}[{i}]") for i, child in enumerate(value)]
    number = plain_number(value)
    if isinstance(number, numbers.Number) and isinstance(number, _PLAIN):
        return number
    if isinstance(value, enum.Enum):
        return _storable(value.value, tracker, path)
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    text = str(value)
    _warn_converted(tracker, path, value, f"a {type(value).__name__}")
    return text


def _warn_converted(tracker: str, key: str, value: Any, kind: str) -> None:
    warnings.warn(
        f"{tracker} cannot store config value {key!r} ({kind}); it is stored as the text "
        f"{str(value)!r} instead.",
        UserWarning,
        stacklevel=4,
    )


def warn_dropped(tracker: str, key: str, value: Any, accepted: str) -> None:
    """Warn that a logged value was left out because the tracker does not accept its type."""
    warnings.warn(
        f"{tracker} cannot log {key!r} = {value!r} (a {type(value).__name__}; it accepts {accepted}); "
        "this value was skipped.",
        UserWarning,
        stacklevel=4,
    )
