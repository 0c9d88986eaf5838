"""`DeepSpeedConfig` (also `HfDeepSpeedConfig`): a DeepSpeed config read from a dict, a JSON file or
(base64) JSON text, with dotted-key lookups. Re-exported by `cadence.plugins.deepspeed`.
"""

from __future__ import annotations

import base64
import copy
import json
import os
from typing import Any


class DeepSpeedConfig:
    """A DeepSpeed config dict (from a dict, a JSON file, a JSON string or base64 JSON) with lookups.

    Args:
        config_file_or_dict (Any): A dict, another `DeepSpeedConfig`, the path of a JSON file, or the
            JSON text itself (plain or base64-encoded).

    Raises:
        ValueError: Something that does not decode to a JSON object.
    """

    def __init__(self, config_file_or_dict: Any) -> None:
        if isinstance(config_file_or_dict, DeepSpeedConfig):
            config = copy.deepcopy(config_file_or_dict.config)
        elif isinstance(config_file_or_dict, dict):
            config = copy.deepcopy(config_file_or_dict)
        elif isinstance(config_file_or_dict, (str, os.PathLike)) and os.path.exists(
            config_file_or_dict
        ):
            with open(config_file_or_dict, encoding="utf-8") as f:
                config = json.load(f)
        else:
            config = self._decode(config_file_or_dict)
        if not isinstance(config, dict):
            raise ValueError(
                f"A DeepSpeed config must be a JSON object, got {type(config).__name__}."
            )
        self.config = config
        self.set_stage_and_offload()

    @staticmethod
    def _decode(text: Any) -> Any:
        try:
            try:
                return json.loads(text)
            except json.JSONDecodeError:
                return json.loads(base64.urlsafe_b64decode(text).decode("utf-8"))
        except (UnicodeDecodeError, AttributeError, ValueError, TypeError):
            raise ValueError(
                "hf_ds_config must be a path to an existing DeepSpeed JSON file, a dict, or a (base64) JSON "
                f"string; got {text!r}."
            ) from None

    def set_stage_and_offload(self) -> None:
        """Read the ZeRO stage and whether optimizer/parameters are offloaded from the config."""
        self._stage = self.get_value("zero_optimization.stage", -1)
        devices = {
            self.get_value("zero_optimization.offload_optimizer.device"),
            self.get_value("zero_optimization.offload_param.device"),
        }
        self._offload = self._stage in (2, 3) and bool(devices & {"cpu", "nvme"})

    def find_config_node(self, ds_key_long: str) -> tuple[dict | None, str]:
        """The dict holding dotted key `ds_key_long` and its last part (None: no such parent).

        Args:
            ds_key_long (str): A dotted path into the config, e.g. "zero_optimization.stage".

        Returns:
            tuple[dict | None, str]: The parent dict and the last key.
        """
        node: Any = self.config
        *parents, key = ds_key_long.split(".")
        for name in parents:
            node = node.get(name) if isinstance(node, dict) else None
            if node is None:
                return None, key
        return node, key

    def get_value(self, ds_key_long: str, default: Any = None) -> Any:
        """The value at dotted key `ds_key_long`, or `default` when absent.

        Args:
            ds_key_long (str): A dotted path into the config, e.g. "zero_optimization.stage".
            default (Any): The value when there is no such entry (default None).
        """
        node, key = self.find_config_node(ds_key_long)
        return default if node is None else node.get(key, default)

    def del_config_sub_tree(self, ds_key_long: str, must_exist: bool = False) -> None:
        """Remove the entry at `ds_key_long`; raise if absent and `must_exist`.

        Args:
            ds_key_long (str): A dotted path into the config, e.g. "zero_optimization.stage".
            must_exist (bool): Raise when there is no such entry (default False: do nothing).

        Raises:
            ValueError: With `must_exist`, a missing entry.
        """
        node, key = self.find_config_node(ds_key_long)
        if node is None or key not in node:
            if must_exist:
                raise ValueError(f"{ds_key_long} is not in the DeepSpeed config.")
            return
        node.pop(key)

    def is_true(self, ds_key_long: str) -> bool:
        """Whether the value at `ds_key_long` is set and truthy.

        Args:
            ds_key_long (str): A dotted path into the config, e.g. "zero_optimization.stage".
        """
        value = self.get_value(ds_key_long)
        return False if value is None else bool(value)

    def is_false(self, ds_key_long: str) -> bool:
        """Whether the value at `ds_key_long` is set and falsy.

        Args:
            ds_key_long (str): A dotted path into the config, e.g. "zero_optimization.stage".
        """
        value = self.get_value(ds_key_long)
        return False if value is None else not bool(value)

    def is_zero2(self) -> bool:
        """Whether the config uses ZeRO stage 2."""
        return self._stage == 2

    def is_zero3(self) -> bool:
        """Whether the config uses ZeRO stage 3."""
        return self._stage == 3

    def is_offload(self) -> bool:
        """Whether ZeRO 2/3 offloads the optimizer or parameters to CPU or NVMe."""
        return self._offload
