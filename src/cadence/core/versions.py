"""Version comparisons: `compare_versions` for any installed library, `is_torch_version` for torch."""

from __future__ import annotations

import importlib.metadata
import operator
from collections.abc import Callable
from typing import Any

from packaging.version import Version, parse

STR_OPERATION_TO_FUNC: dict[str, Callable[[Any, Any], bool]] = {
    ">": operator.gt,
    ">=": operator.ge,
    "==": operator.eq,
    "!=": operator.ne,
    "<=": operator.le,
    "<": operator.lt,
}

torch_version = parse(importlib.metadata.version("torch"))


def compare_versions(
    library_or_version: str | Version, operation: str, requirement_version: str
) -> bool:
    """Compare an installed library's version (given by name) or a `Version` with `requirement_version`.

    A string is always a distribution name whose installed version is looked up; pass
    `packaging.version.parse("1.2")` to compare a literal version.

    Example:
        >>> compare_versions("torch", ">=", "2.0")
        True

    Args:
        library_or_version (str | Version): An installed distribution's name, or a parsed version.
        operation (str): One of ">", ">=", "==", "!=", "<=", "<".
        requirement_version (str): The version to compare with.

    Returns:
        bool: The result of the comparison.

    Raises:
        ValueError: An unknown `operation`.
        importlib.metadata.PackageNotFoundError: A name that is not installed.
    """
    if operation not in STR_OPERATION_TO_FUNC:
        raise ValueError(
            f"`operation` must be one of {list(STR_OPERATION_TO_FUNC)}, received {operation}"
        )
    if isinstance(library_or_version, str):
        library_or_version = parse(importlib.metadata.version(library_or_version))
    return STR_OPERATION_TO_FUNC[operation](library_or_version, parse(requirement_version))


def is_torch_version(operation: str, version: str) -> bool:
    """Compare the installed torch version with `version` using `operation` (">=", "<", ...).

    Example:
        >>> is_torch_version(">=", "2.0")
        True

    Args:
        operation (str): One of ">", ">=", "==", "!=", "<=", "<".
        version (str): The version to compare with.

    Returns:
        bool: The result of the comparison.
    """
    return compare_versions(torch_version, operation, version)
