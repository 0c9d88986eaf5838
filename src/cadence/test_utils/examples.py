"""Helpers for checking that "complete" example scripts contain every feature example's code:
extract a function's lines, drop comments and blank lines, compare."""

from __future__ import annotations

import os


def get_function_contents_by_name(lines: list[str], name: str) -> list[str] | None:
    """The lines of `def training_function` or `def main` in `lines` (up to the next of the two
    markers `def main` / `if __name__`).

    Raises:
        ValueError: `name` is neither "training_function" nor "main".

    Args:
        lines (list[str]): Lines of an example script.
        name (str): "training_function" or "main".

    Returns:
        list[str] | None: The function's lines, or None when it is not there.
    """
    if name not in ("training_function", "main"):
        raise ValueError(
            f"Incorrect function name passed: {name}, choose either 'main' or 'training_function'"
        )
    end_marker = "def main" if name == "training_function" else "if __name__"
    collected: list[str] = []
    inside = False
    for line in lines:
        if not inside:
            if f"def {name}" in line:
                inside = True
                collected.append(line)
            continue
        if end_marker in line:
            return collected
        collected.append(line)
    return None


def clean_lines(lines: list[str]) -> list[str]:
    """`lines` without comment lines and bare newlines.

    Example:
        >>> clean_lines(["x = 1\\n", "# note\\n", "\\n"])
        ['x = 1\\n']

    Args:
        lines (list[str]): Lines of a source file, newlines included.

    Returns:
        list[str]: The lines kept, in order.
    """
    return [line for line in lines if not line.lstrip().startswith("#") and line != "\n"]


def _read(path: str | os.PathLike) -> list[str]:
    with open(path, encoding="utf-8") as handle:
        return handle.readlines()


def compare_against_test(
    base_filename: str,
    feature_filename: str,
    parser_only: bool,
    secondary_filename: str | None = None,
) -> list[str]:
    """The lines new in `feature_filename` (relative to `examples/nlp_example.py`, and to
    `secondary_filename` when given) that are missing from `base_filename`; empty when the
    complete example holds every feature. Compares the `main` functions when `parser_only`, the
    `training_function`s otherwise.

    Args:
        base_filename (str): The complete example every feature should be in.
        feature_filename (str): The example of one feature.
        parser_only (bool): Compare the `main` functions (the argument parsers) instead of the
            `training_function`s.
        secondary_filename (str | None): Another example whose lines do not count as new either.

    Returns:
        list[str]: The missing lines.
    """
    function = "main" if parser_only else "training_function"

    def body(path: str | os.PathLike) -> list[str]:
        return clean_lines(get_function_contents_by_name(_read(path), function) or [])

    base = body(base_filename)
    template = set(body(os.path.abspath(os.path.join("examples", "nlp_example.py"))))
    if secondary_filename is not None:
        template |= set(body(secondary_filename))
    dataloader_line = (
        "train_dataloader, eval_dataloader = get_dataloaders(accelerator, batch_size)\n"
    )
    new_code = [
        line for line in body(feature_filename) if line not in template and line != dataloader_line
    ]
    return [line for line in new_code if line not in base]
