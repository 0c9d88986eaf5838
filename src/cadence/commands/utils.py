"""Argument-parser classes whose options accept both spellings, `--some_flag` and `--some-flag`."""

from __future__ import annotations

import argparse
from typing import Any


def _with_dash_spellings(names: tuple[str, ...]) -> tuple[str, ...]:
    spellings: list[str] = []
    for name in names:
        spellings.append(name)
        if name.startswith("--") and "_" in name[2:]:
            dashed = "--" + name[2:].replace("_", "-")
            if dashed not in names:
                spellings.append(dashed)
    return tuple(spellings)


class CustomArgumentGroup(argparse._ArgumentGroup):
    """An argument group whose `--some_flag` options also answer to `--some-flag`."""

    def add_argument(self, *args: Any, **kwargs: Any) -> argparse.Action:
        """Add an argument, accepting the dash and underscore spellings of its options.

        Args:
            *args: The option strings (or the positional's name), as for `argparse`.
            **kwargs: The argument's settings (type, default, help ...), as for `argparse`.

        Returns:
            argparse.Action: The action created.
        """
        return super().add_argument(*_with_dash_spellings(args), **kwargs)


class CustomArgumentParser(argparse.ArgumentParser):
    """An ArgumentParser whose `--some_flag` options also answer to `--some-flag` (groups too).

    Example:
        >>> parser = CustomArgumentParser()
        >>> _ = parser.add_argument("--num_processes", type=int)
        >>> parser.parse_args(["--num-processes", "2"]).num_processes
        2
    """

    def add_argument(self, *args: Any, **kwargs: Any) -> argparse.Action:
        """Add an argument, accepting the dash and underscore spellings of its options.

        Args:
            *args: The option strings (or the positional's name), as for `argparse`.
            **kwargs: The argument's settings (type, default, help ...), as for `argparse`.

        Returns:
            argparse.Action: The action created.
        """
        return super().add_argument(*_with_dash_spellings(args), **kwargs)

    def add_argument_group(self, *args: Any, **kwargs: Any) -> CustomArgumentGroup:
        """Add an argument group whose options also accept both spellings.

        Args:
            *args: As for `argparse.ArgumentParser.add_argument_group` (title, description).
            **kwargs: As for `argparse.ArgumentParser.add_argument_group`.

        Returns:
            CustomArgumentGroup: The group.
        """
        group = CustomArgumentGroup(self, *args, **kwargs)
        self._action_groups.append(group)
        return group
