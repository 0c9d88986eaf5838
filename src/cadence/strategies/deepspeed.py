"""DeepSpeed ZeRO (stages 0-3): `prepare` builds the DeepSpeed engine from the model, optimizer and
scheduler; `backward` runs the engine's backward and, on gradient-sync steps, its step (which clips,
updates, zeroes the gradients and steps a DeepSpeed scheduler). The engine scales the loss for
accumulation and mixed precision itself.

On CPU DeepSpeed runs with its CPU accelerator over the existing gloo group. Its shared-memory
all-reduce is a C++ op built on first use (about a minute) and cached under this Python environment
(`TORCH_EXTENSIONS_DIR`); set `CADENCE_DEEPSPEED_SHM_COMM=0` to skip it and reduce through gloo.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import sys
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from ..core.settings import env_bool
from ..plugins.deepspeed import deepspeed_missing_error
from ..runtime.state import GradientState
from ..runtime.topology import detect_topology
from ..training.scheduler import AcceleratedScheduler
from .base import Strategy
from .deepspeed_engine import build_engine
from .deepspeed_ulysses import UlyssesLoader, check_model, register
from .deepspeed_wrappers import (  # noqa: F401  (public names of this module in the reference)
    DeepSpeedEngineWrapper,
    DeepSpeedOptimizerWrapper,
    DeepSpeedSchedulerWrapper,
)

logger = logging.getLogger(__name__)

CHECKPOINT_TAG = "pytorch_model"


def import_deepspeed(device: torch.device) -> Any:
    """Import deepspeed for this device (the CPU accelerator on CPU), with a clear error if missing."""
    if device.type == "cpu":
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
        os.environ.setdefault("TORCH_EXTENSIONS_DIR", os.path.join(sys.prefix, "torch_extensions"))
    try:
        import deepspeed
    except ImportError:
        raise deepspeed_missing_error() from None
    if device.type == "cpu" and not env_bool("CADENCE_DEEPSPEED_SHM_COMM", True):
        import deepspeed.ops

        deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
    return deepspeed


class DeepSpeedStrategy(Strategy):
    """DeepSpeed: the engine owns the model, optimizer, loss scaling, clipping and checkpoints."""

    name = "deepspeed"
    divides_loss_for_accumulation = False
    saves_sharded_state = True
    reshards_on_load = False  # engine.load_checkpoint reads the partitions of the saved world

    def __init__(self, *args: Any, gradient_state: GradientState) -> None:
        super().__init__(*args)
        self.gradient_state = gradient_state
        self.deepspeed = import_deepspeed(self.context.device)
        self._ensure_process_group()
        self.engine_wrapper: DeepSpeedEngineWrapper | None = None
        self._ulysses_mpu: Any = None  # set when the model is prepared with sp_size > 1

    def _ensure_process_group(self) -> None:
        if dist.is_initialized():
            self.deepspeed.init_distributed(dist_backend=dist.get_backend())
            return
        # One process without a process group: DeepSpeed needs one, of size 1.

        topology = detect_topology()
        os.environ.setdefault("MASTER_ADDR", topology.master_addr)
        os.environ.setdefault("MASTER_PORT", str(topology.master_port))
        os.environ.setdefault("RANK", "0")
        os.environ.setdefault("LOCAL_RANK", "0")
        os.environ.setdefault("WORLD_SIZE", "1")
        backend = "nccl" if self.context.device.type == "cuda" else "gloo"
        self.deepspeed.init_distributed(dist_backend=backend)

    @property
    def plugin(self) -> Any:
        """The active DeepSpeedPlugin: with several named plugins, the one selected now
        (`AcceleratorState.select_deepspeed_plugin`), which configures the next engine prepared."""
        plugins = self.context.deepspeed_plugins
        if isinstance(plugins, dict):
            for plugin in plugins.values():
                if plugin.selected:
                    return plugin
        return self.context.deepspeed_plugin

    # -- prepare ----------------------------------------------------------------------------------
    def prepare_group(
        self, objects: list[Any], kinds: list[str], placements: list[Any], prepare_one: Any
    ) -> list[Any] | None:
        """Build one DeepSpeed engine from the model, optimizer and scheduler given to `prepare`."""

        if any(p is not None for p in placements):
            raise ValueError(
                "device_placement cannot be customized with DeepSpeed: leave it unset."
            )
        if kinds.count("model") > 1:
            raise ValueError(
                "DeepSpeed takes one model per Accelerator: prepare each model with its own Accelerator "
                "(and DeepSpeedPlugin)."
            )
        if "model" not in kinds:
            if any(k in ("optimizer", "scheduler") for k in kinds) and not self._has_engine:
                raise ValueError(
                    "With DeepSpeed, pass the model together with its optimizer (and scheduler) to one "
                    "prepare() call: the engine is built from all of them."
                )
            return None
        result, engine = build_engine(
            self.deepspeed,
            self.plugin,
            self.context,
            self.gradient_state,
            objects,
            kinds,
            prepare_one,
            sequence_parallel=self._setup_sequence_parallel if self._sp_size > 1 else None,
        )
        # backward() drives the first engine this Accelerator prepared, as in the reference: a second
        # model prepared later (e.g. a frozen one under another plugin) must not take over the training.
        if self.engine_wrapper is None:
            self.engine_wrapper = DeepSpeedEngineWrapper(engine)
        else:
            logger.warning(
                "A wrapped DeepSpeed engine reference is currently tied for this `Accelerator()` "
                "instance: backward() keeps driving the first engine prepared. To call backward() for "
                "the new model, create a separate `Accelerator()` and prepare it there."
            )
        for obj in result:
            if obj is engine:
                self.prepared.models.append(obj)
            elif isinstance(obj, DeepSpeedOptimizerWrapper):
                self.prepared.optimizers.append(obj)
            elif isinstance(obj, AcceleratedScheduler):
                self.prepared.schedulers.append(obj)
        return result

    @property
    def _sp_size(self) -> int:
        config = self.context.parallelism_config
        return config.sp_size if config is not None else 1

    def _setup_sequence_parallel(self, model: torch.nn.Module, micro_batch_size: int) -> Any:
        """Check the model, route its attention through Ulysses; returns the mpu (kept for loaders)."""
        if self._ulysses_mpu is not None:
            raise ValueError(
                "Sequence parallelism is set up once per process: prepare one model with sp_size > 1."
            )
        check_model(model, self._sp_size)
        handler = self.context.parallelism_config.sp_handler
        self._ulysses_mpu = register(model, self._sp_size, handler, micro_batch_size)
        return self._ulysses_mpu

    def wrap_data_loader(self, loader: Any) -> Any:
        """With sequence parallelism, each batch is one sample split over the sp group."""
        if self._ulysses_mpu is None:
            return loader
        return UlyssesLoader(loader, self._ulysses_mpu, self.context.device, self.gradient_state)

    def ulysses_loader(self, loader: Any) -> Any:
        """`accelerator.deepspeed_ulysses_dl_adapter`: adapt a loader prepared on its own."""
        if self._ulysses_mpu is None:
            raise ValueError(
                "deepspeed_ulysses_dl_adapter() needs sequence parallelism set up: use "
                "ParallelismConfig(sp_size > 1) with DeepSpeed and prepare the model first."
            )
        return UlyssesLoader(loader, self._ulysses_mpu, self.context.device, self.gradient_state)

    @property
    def _has_engine(self) -> bool:
        return self.engine_wrapper is not None

    def wrap_model(self, model: torch.nn.Module, evaluation_mode: bool) -> torch.nn.Module:
        """Always raises: with DeepSpeed, a model is prepared together with its optimizer."""
        raise ValueError(
            "With DeepSpeed, prepare the model with accelerator.prepare(model, optimizer, ...): the engine "
            "is built from the model and its optimizer together."
        )

    # -- the training step ------------------------------------------------------------------------
    def backward(self, loss: torch.Tensor, **kwargs: Any) -> None:
        """Run the engine's backward, and its step when gradients sync this step."""
        if self.engine_wrapper is None:
            raise RuntimeError(
                "accelerator.backward() with DeepSpeed needs a model prepared first."
            )
        sync = self.gradient_state.sync_gradients
        self.engine_wrapper.backward(loss, sync_gradients=sync, **kwargs)

    def unwrap(self, model: torch.nn.Module) -> torch.nn.Module:
        """The module inside a DeepSpeed engine (else `model` itself)."""
        return model.module if self.is_wrapped(model) else model

    def is_wrapped(self, model: Any) -> bool:
        """Whether `model` is a DeepSpeed engine."""
        return isinstance(model, self.deepspeed.DeepSpeedEngine)

    def no_sync(self, model: Any) -> contextlib.AbstractContextManager:
        # ZeRO 2/3 partition gradients while accumulating; only stages 0/1 can skip the all-reduce.
        """Skip the gradient all-reduce while accumulating (ZeRO stages 0 and 1 only)."""
        if (
            _zero_stage(model, self.plugin) < 2
            and hasattr(model, "no_sync")
            and self.context.use_distributed
        ):
            return model.no_sync()
        return contextlib.nullcontext()

    def clip_grad_norm_(self, parameters: Any, max_norm: float, norm_type: float) -> Any:
        """DeepSpeed clips inside its step (`gradient_clipping`); this returns the norm it measured."""
        if self.engine_wrapper is None:
            return None
        return self.engine_wrapper.get_global_grad_norm()

    def clip_grad_value_(self, parameters: Any, clip_value: float) -> None:
        """Always raises: DeepSpeed clips gradients by norm only."""
        raise NotImplementedError(
            "DeepSpeed clips gradients by norm only: set gradient_clipping in the DeepSpeedPlugin or config."
        )

    # -- state ------------------------------------------------------------------------------------
    def state_dict(self, model: torch.nn.Module, unwrap: bool = True) -> dict[str, Any]:
        """The model's whole state dict; under ZeRO-3 the gathered 16-bit weights."""
        if _zero_stage(model, self.plugin) == 3:
            if not model.zero_gather_16bit_weights_on_model_save():
                raise ValueError(
                    f"[rank {self.context.process_index}] ZeRO-3 keeps each weight partitioned: the "
                    "whole state dict is only gathered when stage3_gather_16bit_weights_on_model_save is "
                    "true. Set zero3_save_16bit_model=True in the DeepSpeedPlugin (or that key in the "
                    "DeepSpeed config), or save a sharded checkpoint with save_state()."
                )
            return model._zero3_consolidated_16bit_state_dict()
        from deepspeed.checkpoint.utils import clone_tensors_for_torch_save

        return clone_tensors_for_torch_save(self.unwrap(model).state_dict())

    def save_sharded_state(
        self, directory: Any, models: list[Any], optimizers: list[Any]
    ) -> list[str]:
        """`engine.save_checkpoint` into `directory` (one tag per model); returns this rank's files."""
        base = Path(directory)
        tags = []
        for index, engine in enumerate(models):
            tag = CHECKPOINT_TAG if index == 0 else f"{CHECKPOINT_TAG}_{index}"
            engine.save_checkpoint(str(base), tag)
            tags.append(tag)
        dist.barrier()
        return _files_of_rank(base, tags, self.context.process_index)

    def load_sharded_state(
        self, directory: Any, models: list[Any], optimizers: list[Any], open_file: Any = None
    ) -> None:
        """`engine.load_checkpoint` from `directory` for each model; raises if a tag is missing.

        DeepSpeed reads its files by path, so `open_file` is not used: the checkpointer verifies
        every file of the checkpoint before this runs.
        """
        for index, engine in enumerate(models):
            tag = CHECKPOINT_TAG if index == 0 else f"{CHECKPOINT_TAG}_{index}"
            if not (Path(directory) / tag).is_dir():
                raise FileNotFoundError(
                    f"[rank {self.context.process_index}] No DeepSpeed checkpoint {tag!r} in {directory}."
                )
            path, _ = engine.load_checkpoint(str(directory), tag)
            if path is None:
                raise RuntimeError(
                    f"DeepSpeed could not load the checkpoint {tag!r} from {directory}."
                )


def _zero_stage(model: Any, plugin: Any) -> int:
    """The ZeRO stage of `model`'s own engine (engines of several plugins may differ), else the plugin's."""
    stage = getattr(model, "zero_optimization_stage", None)
    return int(stage()) if callable(stage) else int(plugin.zero_stage)


_RANK_FILE = re.compile(r"zero_pp_rank_(\d+)_")


def _files_of_rank(base: Path, tags: list[str], rank: int) -> list[str]:
    """The files DeepSpeed wrote for `rank`: its ZeRO partitions; rank 0 also the shared ones."""
    written = [p for tag in tags for p in (base / tag).rglob("*") if p.is_file()]
    written += [base / name for name in ("latest", "zero_to_fp32.py") if (base / name).is_file()]
    mine = []
    for path in sorted(written):
        match = _RANK_FILE.search(path.name)
        owner = int(match.group(1)) if match else 0
        if owner == rank:
            mine.append(path.relative_to(base).as_posix())
    return mine
