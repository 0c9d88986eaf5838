"""The prepared model under pipeline parallelism: its forward runs the whole schedule.

`model(inputs, labels=targets)` cuts the batch into micro-batches, runs torch's schedule (the forward
and the backward of every micro-batch, on every stage of the pipeline) and returns the loss on every
rank: the mean of the last stage's micro-batch losses, broadcast over the pipeline group. The
gradients are then in the stages' parameters, so `accelerator.backward(loss)` has nothing left to do.
Under `torch.no_grad()` it runs the schedule's forward only and returns the loss the same way.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from ...core.input_errors import rank_prefix


@dataclass
class PipelineRanks:
    """Where this process sits in the pipeline (given by the strategy that built it)."""

    group: Any  # the pipeline's process group (one rank per stage position)
    size: int
    rank: int  # this process's rank in `group`
    stage_indices: tuple[int, ...]  # the stages this process runs
    num_stages: int
    last_stage_rank: int  # the rank in `group` that runs the last stage
    dp_group: Any = None  # replicas of this stage to average gradients with (dp_replicate only)
    dp_size: int = 1

    @property
    def has_first(self) -> bool:
        """Whether this process runs the first stage (it reads the batch's inputs)."""
        return 0 in self.stage_indices

    @property
    def has_last(self) -> bool:
        """Whether this process runs the last stage (it reads the labels and computes the loss)."""
        return self.num_stages - 1 in self.stage_indices


class StageLoss:
    """The loss the schedule computes on the last stage: the user's, recorded for the report, divided
    so that the gradients are those of the batch's mean loss over micro-batches and accumulation
    steps (torch's own `scale_grads` is off: it would also divide gradients kept from earlier
    accumulation steps)."""

    def __init__(self, loss_fn: Any) -> None:
        self.loss_fn = loss_fn
        self.scale = 1
        self.raw: list[torch.Tensor] = []

    def __call__(self, output: Any, target: Any) -> torch.Tensor:
        """`loss_fn(output, target) / scale`, keeping the undivided value."""
        raw = self.loss_fn(output, target)
        self.raw.append(raw.detach())
        return raw / self.scale


class PipelineOutput:
    """What a transformers model returns under pipeline parallelism: only the loss (`.loss`,
    `["loss"]`, `[0]`); the logits stay on the last stage and are not returned."""

    def __init__(self, loss: torch.Tensor) -> None:
        self.loss = loss

    def __getitem__(self, key: Any) -> torch.Tensor:
        if key in ("loss", 0):
            return self.loss
        raise KeyError(_ONLY_LOSS.format(name=key))

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        raise AttributeError(_ONLY_LOSS.format(name=name))


_ONLY_LOSS = (
    "Under pipeline parallelism the prepared model returns only the loss, not {name!r}: the outputs "
    "stay on the last stage's process. Evaluate logits with the unprepared model, or compute your "
    "metric in the loss function given to PipelineParallelConfig(loss_fn=...)."
)


class PipelinedModel(torch.nn.Module):
    """This process's stages of a model and the schedule that trains them (see the module docstring).

    Its only child, `module`, holds this process's units under the model's own names.
    """

    _schedule: Any  # torch's schedule, kept in __dict__ (it holds the stages: not a submodule)

    def __init__(
        self,
        module: torch.nn.Module,
        schedule: Any,
        ranks: PipelineRanks,
        *,
        n_microbatches: int,
        loss: StageLoss,
        accumulation_steps: Callable[[], int],
        sync_gradients: Callable[[], bool],
        transformers_output: bool,
        device: torch.device,
        evaluates: bool = True,
    ) -> None:
        super().__init__()
        self.module = module
        # Plain attributes (not submodules): the schedule holds the stage modules, which share
        # `module`'s parameters.
        self.__dict__["_schedule"] = schedule
        self._ranks = ranks
        self._n_microbatches = n_microbatches
        self._loss = loss
        self._accumulation_steps = accumulation_steps
        self._sync_gradients = sync_gradients
        self._transformers_output = transformers_output
        self._device = device
        self._evaluates = evaluates
        if hasattr(module, "config"):  # a transformers model's config stays readable
            self.config = module.config

    # -- the schedule-driven forward ----------------------------------------------------------------
    def forward(self, *args: Any, labels: Any = None, **kwargs: Any) -> Any:
        """Run the schedule on the batch (see the module docstring); returns the mean loss."""
        ranks = self._ranks
        if "input_ids" in kwargs and not args:
            args = (kwargs.pop("input_ids"),)
        mask = kwargs.pop("attention_mask", None)
        if mask is not None and not bool(torch.as_tensor(mask).all()):
            raise ValueError(
                f"{rank_prefix()}Under pipeline parallelism a transformers model runs without padding: "
                "attention_mask has zeros. Pack the sequences to one length (or drop the mask)."
            )
        if kwargs:
            raise TypeError(
                f"{rank_prefix()}Under pipeline parallelism the prepared model takes the inputs and "
                f"labels= only; it got {sorted(kwargs)}. Pass the first stage's inputs positionally."
            )
        if labels is None:
            raise ValueError(
                f"{rank_prefix()}Under pipeline parallelism the prepared model computes the loss itself: "
                "call it as model(inputs, labels=targets) (transformers: model(**batch) with labels)."
            )
        batch = labels.shape[0] if hasattr(labels, "shape") else len(labels)
        if batch % self._n_microbatches:
            raise ValueError(
                f"{rank_prefix()}The batch of {batch} samples does not divide into "
                f"{self._n_microbatches} equal micro-batches: make the per-process batch size a "
                "multiple of n_microbatches (unequal micro-batches would change the mean loss)."
            )
        args = tuple(a.to(self._device) if isinstance(a, torch.Tensor) else a for a in args)
        if isinstance(labels, torch.Tensor):
            labels = labels.to(self._device)
        training = torch.is_grad_enabled()
        if not training and not self._evaluates:
            raise ValueError(
                f"{rank_prefix()}The ZBVZeroBubble schedule cannot evaluate under torch.no_grad() "
                "(torch's forward-only run of it still schedules backward actions): evaluate with "
                "another schedule, or with the model before prepare()."
            )
        self._loss.scale = self._n_microbatches * (self._accumulation_steps() if training else 1)
        self._loss.raw = []
        inputs = args if ranks.has_first else ()
        target = labels if ranks.has_last else None
        if training:
            self._schedule.step(*inputs, target=target, return_outputs=False)
            self._average_replicas()
        else:
            self._schedule.eval(*inputs, target=target)
        loss = self._broadcast_loss()
        return PipelineOutput(loss) if self._transformers_output else loss

    def _broadcast_loss(self) -> torch.Tensor:
        """The last stage's mean micro-batch loss, on every rank of the pipeline."""
        ranks = self._ranks
        if ranks.has_last:
            # The first step also computes a loss on the placeholder outputs torch's shape inference
            # runs: the step's own losses are the last n_microbatches.
            loss = torch.stack(self._loss.raw[-self._n_microbatches :]).float().mean()
        else:
            loss = torch.zeros((), dtype=torch.float32, device=self._device)
        dist.broadcast(loss, group=ranks.group, group_src=ranks.last_stage_rank)
        self._loss.raw = []
        return loss

    def _average_replicas(self) -> None:
        """dp_replicate: average the accumulated gradients across this stage's replicas when this
        step synchronises (what DDP's backward does on one process per replica)."""
        ranks = self._ranks
        if ranks.dp_group is None or not self._sync_gradients():
            return
        for param in self.module.parameters():
            if param.grad is not None:
                dist.all_reduce(param.grad, group=ranks.dp_group)
                param.grad.div_(ranks.dp_size)
