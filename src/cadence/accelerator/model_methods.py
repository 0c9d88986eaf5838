"""The Accelerator's model utilities (unwrap_model, get_state_dict, verify_device_map, free_memory).
A base class of `Accelerator`, kept apart so the façade stays one screenful per concern.
"""

from __future__ import annotations

from typing import Any

import torch

from ..precision.policy import remove_forward_wrapper


class ModelMethods:
    """Model utilities of the Accelerator; they use its strategy and prepared objects."""

    def unwrap_model(
        self,
        model: torch.nn.Module,
        keep_fp32_wrapper: bool = True,
        keep_torch_compile: bool = True,
    ) -> torch.nn.Module:
        """The model you passed to `prepare()`, without the wrappers it added (DDP, FSDP, DeepSpeed, compile).

        Args:
            model (torch.nn.Module): A prepared model.
            keep_fp32_wrapper (bool): Keep the mixed-precision wrapper of `forward` that returns fp32
                outputs (default True); False restores the original `forward`.
            keep_torch_compile (bool): For a compiled model, return the compiled module around the
                unwrapped one (default True); False returns the plain module.

        Returns:
            torch.nn.Module: The user's module.

        Example:
            >>> import torch
            >>> from cadence import Accelerator
            >>> accelerator = Accelerator()
            >>> model = torch.nn.Linear(2, 2)
            >>> accelerator.unwrap_model(accelerator.prepare(model)) is model
            True
        """

        inner, compiled = self._strategy.unwrap_fully(model)
        if not keep_fp32_wrapper:
            remove_forward_wrapper(inner)
        if compiled is not None and keep_torch_compile:
            compiled._orig_mod = inner
            return compiled
        return inner

    def get_state_dict(self, model: torch.nn.Module, unwrap: bool = True) -> dict[str, Any]:
        """The model's full state dict, ready to save, on any backend.

        Sharded models (FSDP, tensor parallel, DeepSpeed ZeRO-3) are gathered whole on the main process, on
        the CPU; the other processes may get an empty dict. With sharded models every process must call it
        (it is a collective).

        Args:
            model (torch.nn.Module): A prepared model.
            unwrap (bool): Take the state dict of the unwrapped model, so its keys are those of your module
                (default True).

        Returns:
            dict[str, Any]: Parameter and buffer names to tensors.
        """
        from ..bigmodel.training_checks import (  # deferred: big-model support loads when a state dict is taken
            offloaded_state_dict,
        )

        # A model dispatched with CPU/disk offload: onload its weights module by module.
        offloaded = offloaded_state_dict(self.unwrap_model(model) if unwrap else model)
        return offloaded if offloaded is not None else self._strategy.state_dict(model, unwrap)

    def verify_device_map(self, model: torch.nn.Module) -> bool:
        """Whether `model` was dispatched over several devices with a device map (big-model inference).

        Such a model cannot be trained in a distributed set-up; `prepare()` refuses it there.

        Args:
            model (torch.nn.Module): A model.

        Returns:
            bool: True when the model carries a device map that spreads it over more than one device.
        """
        from ..bigmodel import training_checks  # deferred: big-model support loads when first asked

        return training_checks.verify_device_map(model)

    def free_memory(self, *objects: Any) -> list[None]:
        """Forget every prepared object, collect garbage and empty the CUDA cache; returns `objects` as Nones.

        Use it between trainings in one process (for example when retrying with a smaller batch): drop your
        own references by assigning the result.

        Args:
            *objects: Your references to prepared objects, to be replaced by None.

        Returns:
            list: As many `None`s as objects passed (a list, as Accelerate returns).

        Example:
            >>> import torch
            >>> from cadence import Accelerator
            >>> accelerator = Accelerator()
            >>> model = accelerator.prepare(torch.nn.Linear(2, 2))
            >>> model, = accelerator.free_memory(model)
            >>> model is None
            True
        """
        import gc

        self._prepared.clear_training_objects()
        self.step = 0
        objects = [None for _ in objects]
        gc.collect()
        if torch.cuda.is_initialized():  # no CUDA context, no cache (and no context created here)
            torch.cuda.empty_cache()
        return objects

    def clear(self, *objects: Any) -> list[None]:
        """The same as `free_memory`.

        Args:
            *objects: Your references to prepared objects, to be replaced by None.

        Returns:
            list: As many `None`s as objects passed.
        """
        return self.free_memory(*objects)
