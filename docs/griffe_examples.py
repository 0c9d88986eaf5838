"""A griffe extension for the documentation build: render Cadence's docstring examples as code.

Cadence's docstrings write `Example:` followed by doctest lines (`>>>`), or an reST literal block
after `Example::`. The Google-style parser treats only `Examples:` as a section of doctests, so this
renames the first form's title, and turns the second form's title into plain text in front of the
indented (Markdown) code block. Source files are not changed; only what the site shows.
"""

from __future__ import annotations

import re
from typing import Any

import griffe

DOCTEST_TITLE = re.compile(r"^(\s*)Example:\s*\n(?=\s*>>>)", re.MULTILINE)
LITERAL_TITLE = re.compile(r"^(\s*)Example::\s*$", re.MULTILINE)


class DocstringExamples(griffe.Extension):
    """Rewrite example titles in every docstring griffe loads."""

    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        """Called by griffe for each loaded object."""
        if obj.docstring is None:
            return
        text = DOCTEST_TITLE.sub(r"\1Examples:\n", obj.docstring.value)
        obj.docstring.value = LITERAL_TITLE.sub(r"\1Example:", text)
