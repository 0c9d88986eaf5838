"""Imported by the wheel's `.pth` startup hook when `CADENCE_AS_ACCELERATE` is on: installs the alias
before any user code runs. The hook line itself checks the variable, so an unset variable imports
nothing of Cadence."""

from __future__ import annotations

from cadence.alias import enabled_in_environment, install

if enabled_in_environment():
    install()
