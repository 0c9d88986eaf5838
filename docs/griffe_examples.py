"""A griffe extension for the documentation build: render Cadence's docstring examples as code.

Cadence's docstrings write `Example:` followed by doctest lines (`>>>`), or an reST literal block
after `Example::`. The Google-style parser treats only `Examples:` as a section of doctests, so this
renames the first form's title. The second form's indented block would become a Markdown paragraph
once griffe removes the section's indentation (the whole example on one line), so it becomes an
`Example:` section holding a fenced Python block. Source files are not changed; only what the site shows.
"""

from __future__ import annotations

import re
import textwrap
from typing import Any

import griffe

DOCTEST_TITLE = re.compile(r"^(\s*)Examples?:\s*\n(?=\s*>>>)", re.MULTILINE)
# `Example::`, a blank line, then the block: every following line that is blank or indented deeper.
LITERAL_BLOCK = re.compile(
    r"^(?P<indent>[ \t]*)Examples?::[ \t]*\n(?P<block>(?:[ \t]*\n|(?P=indent)[ \t]+\S.*\n?)+)",
    re.MULTILINE,
)


def fence_literal_block(match: re.Match) -> str:
    """`Example::` and its indented block -> an `Example:` section holding a fenced Python block."""
    indent = match["indent"]
    block = textwrap.dedent(match["block"]).strip("\n")
    trailing = match["block"][len(match["block"].rstrip("\n")) :]
    inner = indent + "    "
    fenced = [f"{inner}```python"]
    fenced += [f"{inner}{line}" if line.strip() else "" for line in block.splitlines()]
    fenced.append(f"{inner}```")
    return f"{indent}Example:\n" + "\n".join(fenced) + (trailing or "\n")


# Docstrings call Hugging Face Accelerate "the reference" (the project's word for the library whose API
# Cadence implements); users know it as Accelerate.
ACCELERATE_NAMES = [
    (re.compile(r"\b[Tt]he(\s+)reference(\s+)library's\b"), "Accelerate's"),
    (re.compile(r"\b[Tt]he(\s+)reference(\s+)library\b"), "Accelerate"),
    (re.compile(r"\b[Tt]he(\s+)reference(\s+)launcher\b"), "Accelerate's launcher"),
    (re.compile(r"\b[Tt]he(\s+)reference's\b"), "Accelerate's"),
    (re.compile(r"\b[Tt]he(\s+)reference\b"), "Accelerate"),
    (re.compile(r"^Reference path: re-exports\b"), "Accelerate's module path; it re-exports"),
]


def say_accelerate(text: str) -> str:
    """`text` with "the reference" written as "Accelerate", as on every user-facing page."""
    for pattern, name in ACCELERATE_NAMES:
        text = pattern.sub(name, text)
    return text


def rewrite(text: str) -> str:
    """The docstring with both example forms turned into what the Google-style parser renders, and
    Accelerate called by its name."""
    text = LITERAL_BLOCK.sub(fence_literal_block, say_accelerate(text))
    return DOCTEST_TITLE.sub(r"\1Examples:\n", text)


class DocstringExamples(griffe.Extension):
    """Rewrite example titles in every docstring griffe loads."""

    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        """Called by griffe for each loaded object."""
        if obj.docstring is not None:
            obj.docstring.value = rewrite(obj.docstring.value)
