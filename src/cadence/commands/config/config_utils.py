"""Accelerate's `commands.config.config_utils` path: the dynamo backend names a config may use
and the help formatter of the `config` subcommands."""

from __future__ import annotations

import argparse

from ...core.enums import DynamoBackend

# Backends a config file may name for torch.compile (every DynamoBackend but NO).
DYNAMO_BACKENDS = [backend.value for backend in DynamoBackend if backend is not DynamoBackend.NO]


class SubcommandHelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Help formatter of the `config` subcommands: keeps the description's line breaks and drops
    the redundant `{default,update}` choices line from the usage."""

    def _format_usage(self, usage, actions, groups, prefix):  # type: ignore[no-untyped-def]
        text = super()._format_usage(usage, actions, groups, prefix)
        return text.replace("<command> [<args>] ", "")
