"""The reference's `commands.tpu` path (`tpu-config`): TPUs are not supported, every use raises."""

from __future__ import annotations

from ..unsupported.torch_xla import main, tpu_command_launcher, tpu_command_parser

__all__ = ["main", "tpu_command_launcher", "tpu_command_parser"]
