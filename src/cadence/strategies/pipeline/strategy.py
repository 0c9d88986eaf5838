"""Pipeline parallelism (`ParallelismConfig(pp_size=N)`): the model is cut into stages, each process
builds and trains only its own, and torch's schedule (`torch.distributed.pipelining`) moves the
micro-batches between them.

Composition: with `tp_size > 1` each stage's layers are split by the tensor parallel plan; with
`dp_shard_size > 1` each stage is then sharded with FSDP2 over its `dp_shard` ranks (with
`dp_replicate_size > 1` too, HSDP); with `dp_replicate_size > 1` alone, each stage's gradients are
averaged over its replicas when a step synchronises. cp and sp are refused by the config.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import torch

from ...core.enums import DistributedType
from ...core.input_errors import rank_prefix, with_rank
from ...core.torch_compat import FSDP2_ON_GLOO, refuse_before
from ...plugins.pipeline import SINGLE_STAGE_SCHEDULES
from ...runtime.state import GradientState
from ..grad_norm import clip_grad_norm_global
from ..mesh import check_plan, device_mesh, parallel_style, tensor_parallel_plan, tp_mesh
from ..param_remap import named_parameters
from ..sharded import ShardedStrategy
from .checkpoint import load_optimizers, save_optimizers
from .materialize import materialize, plan_materialization, rebuild_rotary
from .model import PipelinedModel, PipelineRanks, StageLoss
from .split import (
    balanced_decoder_partition,
    chain_units,
    check_untied,
    decoder_layout,
    partition,
)
from .stages import build_stage, causal_lm_loss, local_part


def stage_indices(rank: int, size: int, per_process: int, v_shape: bool) -> tuple[int, ...]:
    """The stages pipeline rank `rank` runs: looped (`rank`, `rank + size`, ...) or, for the V-shaped
    schedules (ZBVZeroBubble), `rank` and `2 * size - 1 - rank`."""
    if v_shape:
        return (rank, 2 * size - 1 - rank)
    return tuple(rank + size * k for k in range(per_process))


class PipelineStrategy(ShardedStrategy):
    """Each process runs its stages of the model on torch's pipeline schedule."""

    name = "pipeline"
    # The pipelined forward divides the micro-batch losses by the accumulation steps itself (see
    # StageLoss); the division of the returned loss in Accelerator.backward changes nothing then,
    # and keeps Cadence's reweighting of a dataloader's last, shorter window on.
    divides_loss_for_accumulation = True

    def __init__(self, *args: Any, gradient_state: GradientState) -> None:
        super().__init__(*args)
        self.gradient_state = gradient_state
        config = self.context.parallelism_config
        self.config = config
        self.handler = config.pp_handler
        if self.context.distributed_type == DistributedType.DEEPSPEED:
            raise ValueError(
                f"{rank_prefix()}Pipeline parallelism (pp_size={config.pp_size}) cannot be combined with "
                "DeepSpeed in Cadence: drop the DeepSpeed plugin (pp composes with FSDP2 through "
                "dp_shard_size)."
            )
        if self.precision.scaler is not None:
            raise ValueError(
                f"{rank_prefix()}Pipeline parallelism cannot use fp16 with a loss scaler (the schedule "
                "runs backward inside the forward): use mixed_precision='bf16' or 'no'."
            )
        self._local_params: set[int] = set()
        self._pp_group: Any = None

    # -- building the stages ------------------------------------------------------------------------
    def place_model(self, model: torch.nn.Module) -> torch.nn.Module:
        """Left where it is: only this process's stages are moved to the device, in wrap_model."""
        return model

    def wrap_model(self, model: torch.nn.Module, evaluation_mode: bool) -> torch.nn.Module:
        """Cut `model` into stages, keep this process's (freeing the others' weights), shard them with
        FSDP2 when dp_shard_size > 1, and return the `PipelinedModel` that runs the schedule."""
        if isinstance(model, PipelinedModel):
            return model
        handler, config = self.handler, self.config
        mesh = device_mesh(config, self.context.device)
        pp_mesh = mesh["pp"]
        pp_rank, pp_size = pp_mesh.get_local_rank(), config.pp_size
        total = handler.stage_count(pp_size)
        layout = decoder_layout(model)
        # Everything that can fail on bad input runs before anything is changed or communicated.
        if handler.split_points is None and layout is not None:
            stage_units = balanced_decoder_partition(model, layout, total)
        else:
            units = chain_units(model)
            weights = [sum(p.numel() for p in model.get_submodule(u).parameters()) for u in units]
            stage_units = partition(units, total, handler.split_points, weights)
        _check_covered(model, stage_units)
        check_untied(model, stage_units)
        plan = self._tensor_parallel_plan(model)
        loss_fn = handler.loss_fn or (causal_lm_loss if layout is not None else None)
        if loss_fn is None:
            raise ValueError(
                f"{rank_prefix()}Under pipeline parallelism the last stage computes the loss: give it "
                "as ParallelismConfig(pp_handler=PipelineParallelConfig(loss_fn=...)), called as "
                "loss_fn(output, labels) (a transformers causal LM has a default)."
            )
        self._refuse_where_fsdp_is_wrong()
        v_shape = handler.schedule == "ZBVZeroBubble"
        mine = stage_indices(pp_rank, pp_size, handler.stages_per_process, v_shape)
        device = self.context.device
        if (
            layout is not None and layout.rotary is not None
        ):  # weightless: harmless if refused later
            rebuild_rotary(model, layout.rotary, device)
        stages = [build_stage(model, stage_units[i], layout) for i in mine]
        before = [named_parameters(stage) for stage in stages]
        # Built with init_empty_weights: only this process's stages get memory (checked here,
        # applied once the other stages are freed).
        initialize = plan_materialization(model, stages)
        for index, units in enumerate(stage_units):
            if index not in mine:
                for name in units:  # other processes' stages: their weights are freed here
                    model.get_submodule(name).to("meta")
        materialize(initialize, device)
        for stage in stages:
            stage.to(device)
        self._split_tensors(stages, plan)
        self._shard_stages(stages)
        for stage, names in zip(stages, before):  # the optimizer holds the parameters of `before`
            self.remap.record(names, named_parameters(stage))
        for stage in stages:
            self.precision.wrap_forward(stage)
        return self._pipelined(model, stages, stage_units, mine, loss_fn, pp_mesh, v_shape)

    def _tensor_parallel_plan(self, model: torch.nn.Module) -> dict[str, Any] | None:
        """tp_size > 1: the plan, checked against the whole model (every entry must name a module)."""
        if not self.config.tp_enabled:
            return None
        plan = tensor_parallel_plan(self.context, model)
        if plan is None or not isinstance(plan, dict):
            raise ValueError(
                f"{rank_prefix()}pp_size={self.config.pp_size} with tp_size={self.config.tp_size} needs "
                "a tensor parallel plan given as a dict of module names (applied stage by stage): "
                "ParallelismConfig(tp_handler=TorchTensorParallelConfig(tp_plan={...})) or the "
                "model's `tp_plan`; a callable plan cannot be cut into stages."
            )
        check_plan(model, plan)
        return plan

    def _split_tensors(
        self, stages: Sequence[torch.nn.Module], plan: dict[str, Any] | None
    ) -> None:
        """tp_size > 1: each stage's layers split over the `tp` ranks by the entries of the plan that
        name its modules (the stages keep the model's names, so the plan's names apply as they are)."""
        if plan is None:
            return
        import fnmatch

        from torch.distributed.tensor.parallel import parallelize_module

        mesh = tp_mesh(self.context)
        for stage in stages:
            names = [name for name, _ in stage.named_modules() if name]
            mine = {
                pattern: parallel_style(style)
                for pattern, style in plan.items()
                if any(fnmatch.fnmatchcase(name, pattern) for name in names)
            }
            if mine:
                parallelize_module(stage, mesh, mine)

    def _refuse_where_fsdp_is_wrong(self) -> None:
        """dp_shard_size > 1 on CPU/gloo before the torch release where FSDP2's numbers are right
        (as the FSDP2 strategy refuses it; core/torch_compat.py has the releases)."""
        if not self.config.dp_shard_enabled or self.context.device.type != "cpu":
            return
        refuse_before(
            FSDP2_ON_GLOO,
            "pp_size with dp_shard_size (FSDP2 per stage) on CPU/gloo",
            "FSDP2's gradients on gloo differ from one process's before it",
            "run on GPUs (NCCL), or use dp_replicate_size instead of dp_shard_size",
        )

    def _shard_stages(self, stages: Sequence[torch.nn.Module]) -> None:
        """dp_shard_size > 1: FSDP2 on each unit of each stage, then on the stage itself (with the
        FSDP plugin's mixed precision and offload policies when one is given)."""
        if not self.config.dp_shard_enabled:
            return
        from torch.distributed.fsdp import fully_shard

        mesh = device_mesh(self.config, self.context.device)[tuple(self.config.fsdp_dim_names)]
        kwargs: dict[str, Any] = {"mesh": mesh}
        plugin = self.context.fsdp_plugin
        if plugin is not None and plugin.mixed_precision_policy is not None:
            kwargs["mp_policy"] = plugin.mixed_precision_policy
        if plugin is not None and plugin.cpu_offload is not None:
            from torch.distributed.fsdp import CPUOffloadPolicy

            offload = plugin.cpu_offload
            if isinstance(offload, CPUOffloadPolicy) and not torch.cuda.is_available():
                offload = CPUOffloadPolicy(pin_memory=False)  # pinned memory needs a GPU driver
            kwargs["offload_policy"] = offload
        for stage in stages:
            for unit_name in stage._unit_names:
                unit = stage.get_submodule(unit_name)
                if any(True for _ in unit.parameters()):
                    fully_shard(unit, **kwargs)
            # The stage's own parameters are needed again at the start of its backward: kept.
            fully_shard(stage, reshard_after_forward=False, **kwargs)

    def _pipelined(
        self,
        model: torch.nn.Module,
        stages: list[torch.nn.Module],
        stage_units: list[list[str]],
        mine: tuple[int, ...],
        loss_fn: Any,
        pp_mesh: Any,
        v_shape: bool,
    ) -> PipelinedModel:
        from torch.distributed.pipelining import (  # deferred: loaded only when pp_size > 1
            PipelineStage,
        )
        from torch.distributed.pipelining.schedules import get_schedule_class

        handler, config = self.handler, self.config
        total = len(stage_units)
        group = pp_mesh.get_group()
        self._pp_group = group
        device = self.context.device
        pipeline_stages = [
            PipelineStage(stage, index, total, device, group=group)
            for stage, index in zip(stages, mine)
        ]
        n_microbatches = handler.microbatches(config.pp_size)
        loss = StageLoss(loss_fn)
        schedule_class = get_schedule_class(handler.schedule)
        single = handler.schedule in SINGLE_STAGE_SCHEDULES  # these take one stage, not a list
        first = pipeline_stages[0] if single else pipeline_stages
        schedule = schedule_class(
            first, n_microbatches=n_microbatches, loss_fn=loss, scale_grads=False
        )
        dp_group, dp_size = None, 1
        if config.dp_replicate_enabled and not config.dp_shard_enabled:
            dp_mesh = device_mesh(config, device)["dp_replicate"]
            dp_group, dp_size = dp_mesh.get_group(), dp_mesh.size()
        ranks = PipelineRanks(
            group=group,
            size=config.pp_size,
            rank=pp_mesh.get_local_rank(),
            stage_indices=mine,
            num_stages=total,
            last_stage_rank=0 if v_shape else (total - 1) % config.pp_size,
            dp_group=dp_group,
            dp_size=dp_size,
        )
        part = local_part(model, [stage_units[i] for i in mine])
        if hasattr(model, "config"):  # transformers' config, read by integrations on the model
            part.config = model.config
        self._local_params.update(id(p) for p in part.parameters())
        gradient_state = self.gradient_state
        return PipelinedModel(
            part,
            schedule,
            ranks,
            n_microbatches=n_microbatches,
            loss=loss,
            accumulation_steps=lambda: gradient_state.num_steps,
            sync_gradients=lambda: gradient_state.sync_gradients,
            transformers_output=hasattr(model, "config") and decoder_layout(model) is not None,
            device=device,
            evaluates=not v_shape,
        )

    @property
    def scheduler_processes(self) -> int:
        """The data-parallel replicas: every stage (and tensor-parallel rank) of one pipeline reads
        the same batch, so a step consumes one batch per replica, not one per process."""
        return self.config.data_parallel_size

    # -- the training step --------------------------------------------------------------------------
    def is_wrapped(self, model: Any) -> bool:
        """Whether `model` is a `PipelinedModel`."""
        return isinstance(model, PipelinedModel)

    def unwrap(self, model: torch.nn.Module) -> torch.nn.Module:
        """This process's part of the model (its stages' units under the model's own names)."""
        return model.module if isinstance(model, PipelinedModel) else model

    def adopt_optimizer(self, optimizer: torch.optim.Optimizer) -> None:
        """Keep in the optimizer only this process's parameters (sharded ones re-pointed): the other
        stages' parameters are trained by their own processes."""
        self.remap.apply(optimizer)
        if not self._local_params:
            return
        for group in optimizer.param_groups:
            group["params"] = [p for p in group["params"] if id(p) in self._local_params]
        kept = {id(p) for g in optimizer.param_groups for p in g["params"]}
        for param in [p for p in optimizer.state if id(p) not in kept]:
            del optimizer.state[param]

    def backward(self, loss: torch.Tensor, **kwargs: Any) -> None:
        """Nothing to do: the prepared model's forward ran every micro-batch's backward. A loss that
        still has a graph was not computed by it, and is refused."""
        if loss.requires_grad:
            raise ValueError(
                with_rank(
                    "Under pipeline parallelism the prepared model's forward already ran the backward "
                    "pass: pass accelerator.backward() the loss it returned (model(inputs, "
                    "labels=targets)), not a loss computed from other outputs."
                )
            )

    def clip_grad_norm_(
        self, parameters: Iterable[torch.Tensor], max_norm: float, norm_type: float
    ) -> torch.Tensor:
        """Clip by the norm over every stage's gradients (all processes of the pipeline)."""
        return clip_grad_norm_global(list(parameters), max_norm, norm_type, self._pp_group)

    # -- state ----------------------------------------------------------------------------------------
    @property
    def _full_checkpoints(self) -> bool:
        # Each stage writes its own part (torch.distributed.checkpoint); a full file per process
        # would hold one stage only.
        return False

    def _state_model(self, model: Any) -> torch.nn.Module:
        return model.module if isinstance(model, PipelinedModel) else model

    def save_sharded_state(
        self,
        directory: Any,
        models: Sequence[Any],
        optimizers: Sequence[Any],
        *,
        full: bool | None = None,
        first_index: int = 0,
        optimizer_models: Sequence[Any] | None = None,
    ) -> list[str]:
        """Each stage writes its own part: the models through the sharded layout, the optimizers with
        their parameter groups made the same on every stage (pipeline/checkpoint.py). Collective."""

        written = super().save_sharded_state(
            directory, models, [], full=False, first_index=first_index
        )
        owners = self._optimizer_owners(models, optimizers, optimizer_models)
        return written + save_optimizers(Path(directory), list(optimizers), owners, first_index)

    def load_sharded_state(
        self,
        directory: Any,
        models: Sequence[Any],
        optimizers: Sequence[Any],
        open_file: Any = None,
        *,
        full: bool | None = None,
        first_index: int = 0,
        optimizer_models: Sequence[Any] | None = None,
    ) -> None:
        """Load what `save_sharded_state` wrote, on this split or another one. Collective."""

        super().load_sharded_state(
            directory, models, [], open_file, full=False, first_index=first_index
        )
        owners = self._optimizer_owners(models, optimizers, optimizer_models)
        load_optimizers(Path(directory), list(optimizers), owners, first_index, open_file)

    def _optimizer_owners(
        self, models: Sequence[Any], optimizers: Sequence[Any], given: Sequence[Any] | None
    ) -> list[torch.nn.Module]:
        parts = [self._state_model(m) for m in models]
        owners = [self._state_model(m) for m in given or ()]
        return owners or self._owners(parts, optimizers)

    def state_dict(self, model: torch.nn.Module, unwrap: bool = True) -> dict[str, Any]:
        """The whole model's state dict, every stage's part gathered on the main process (on CPU); an
        empty dict on the others."""
        import torch.distributed as dist
        from torch.distributed.tensor import DTensor

        part = self._state_model(model)
        local = {}
        for name, value in part.state_dict().items():
            value = value.full_tensor() if isinstance(value, DTensor) else value
            local[name] = value.detach().cpu()
        gathered: list[Any] = [None] * dist.get_world_size()
        main = dist.get_rank() == 0
        dist.gather_object(local, gathered if main else None, dst=0)
        if not main:
            return {}
        merged: dict[str, Any] = {}
        for states in gathered:
            merged.update(states)
        return merged


def _check_covered(model: torch.nn.Module, stage_units: Sequence[Sequence[str]]) -> None:
    """Every parameter and buffer must belong to a stage: one outside the chain would be lost."""
    covered = {
        id(t)
        for units in stage_units
        for name in units
        for t in (*model.get_submodule(name).parameters(), *model.get_submodule(name).buffers())
    }
    for name, tensor in (*model.named_parameters(), *model.named_buffers()):
        if id(tensor) not in covered and not name.endswith("inv_freq"):
            raise ValueError(
                f"{rank_prefix()}{name} belongs to no pipeline stage: the stages run the model's chain of "
                "units (children in order, lists expanded), and this tensor is outside it. Move it into "
                "a submodule, or split an nn.Sequential."
            )
