"""Accelerate's `commands.config.config_args` path: config-file classes, default locations and
`load_config_from_file` (home: `cadence.launch.config_file`)."""

from __future__ import annotations

import os
from typing import Any

from ...launch.config_file import ClusterConfig, ConfigFile, SageMakerConfig
from ...launch.config_file import _BaseConfig as BaseConfig
from ...launch.config_file import load_config_from_file as _load_config_from_file


def _locations() -> dict[str, str]:
    from ...launch.config_file import (  # deferred: loaded when the command runs (keeps `cadence --help` fast)
        default_config_dir,
        default_config_path,
    )

    config_file = str(default_config_path())
    return {
        "hf_cache_home": str(default_config_dir().parent),
        "cache_dir": str(default_config_dir()),
        "default_json_config_file": config_file,
        "default_yaml_config_file": config_file,
        "default_config_file": config_file,
    }


def __getattr__(name: str) -> Any:
    # The locations follow HF_HOME / XDG_CACHE_HOME at the time they are read.
    locations = _locations()
    if name in locations:
        return locations[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def load_config_from_file(config_file: str | os.PathLike[str] | None) -> ConfigFile:
    """Read, upgrade and validate a config file (the default one when `config_file` is None).

    Args:
        config_file (str | os.PathLike[str] | None): The YAML or JSON config file; None means the
            default location.

    Returns:
        ConfigFile: The loaded config.
    """
    return _load_config_from_file(config_file)


# The locations (cache_dir, default_config_file, ...) are module attributes resolved on access.
__all__ = [
    "BaseConfig",
    "ClusterConfig",
    "SageMakerConfig",
    "load_config_from_file",
]
