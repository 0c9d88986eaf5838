"""Accelerate's `commands.config.cluster` path: the questions for a local or cluster config."""

from __future__ import annotations

from ...launch.config_file import ClusterConfig


def get_cluster_input() -> ClusterConfig:
    """Ask the questions of `cadence config` in the terminal and return the config (not saved)."""
    from ..config_questions import (  # deferred: loaded when the command runs (keeps `cadence --help` fast)
        ask_config,
        make_prompter,
    )

    return ask_config(make_prompter())
