"""The Accelerator's training-loop methods (backward, accumulate, no_sync, autocast, clipping, uneven
inputs, context parallelism). A base class of `Accelerator`, kept apart so the façade stays one
screenful per concern.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from ..options.dataclasses import AutocastKwargs


class TrainingLoopMethods:
    """Training-loop methods of the Accelerator; they use its accumulation, strategy (and its
    precision), prepared objects and process state."""

    # -- the training loop ------------------------------------------------------------------------
    def backward(self, loss: torch.Tensor, **kwargs: Any) -> None:
        """Compute the gradients of `loss`; use it instead of `loss.backward()`.

        With gradient accumulation the loss is divided by the number of steps; with fp16 it is scaled; with
        DeepSpeed the engine's backward runs. Inside `accumulate()` the gradient all-reduce happens only on
        the micro-step that synchronises.

        Args:
            loss (torch.Tensor): The loss (a scalar tensor).
            **kwargs: Passed to the backend's backward (`retain_graph=True`, `create_graph=True`, ...).

        Raises:
            TypeError: `loss` is not a tensor.

        Example:
            >>> import torch
            >>> from cadence import Accelerator
            >>> accelerator = Accelerator()
            >>> model = accelerator.prepare(torch.nn.Linear(3, 1))
            >>> accelerator.backward(model(torch.ones(2, 3)).sum())
            >>> model.weight.grad.tolist()
            [[2.0, 2.0, 2.0]]
        """
        self._accumulation.backward(loss, **kwargs)

    @contextmanager
    def accumulate(self, *models: torch.nn.Module) -> Iterator[None]:
        """Run one micro-step of gradient accumulation: gradients sync only on the last micro-batch of a window.

        Wrap the forward, backward, optimizer step and zero_grad of each batch in it. It counts
        micro-batches; on all but every `gradient_accumulation_steps`-th one the gradient all-reduce is
        skipped and the prepared optimizer's `step()` and `zero_grad()` do nothing, so the same loop body
        works for any number of accumulation steps. The end of a prepared dataloader always closes the
        window (its last, shorter window is averaged over the micro-batches it holds: see
        "Differences from Accelerate").

        Args:
            *models (torch.nn.Module): The prepared models whose gradient synchronisation to skip on the
                micro-steps that do not sync.

        Example:
            >>> import torch
            >>> from cadence import Accelerator
            >>> accelerator = Accelerator(gradient_accumulation_steps=2)
            >>> model = torch.nn.Linear(2, 1)
            >>> optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
            >>> loader = torch.utils.data.DataLoader(torch.randn(8, 2), batch_size=2)
            >>> model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
            >>> synced = []
            >>> for x in loader:
            ...     with accelerator.accumulate(model):
            ...         accelerator.backward(model(x).pow(2).mean())
            ...         synced.append(accelerator.sync_gradients)
            ...         optimizer.step()
            ...         optimizer.zero_grad()
            >>> synced
            [False, True, False, True]
        """
        with self._accumulation.accumulate(models):
            yield

    @contextmanager
    def no_sync(self, model: torch.nn.Module) -> Iterator[None]:
        """Skip the gradient all-reduce of `model` for the backward passes inside the block.

        Gradients then accumulate locally; the first backward outside the block synchronises them. On one
        process it does nothing. `accumulate()` uses it for you.

        Args:
            model (torch.nn.Module): A prepared model.
        """
        with self._strategy.no_sync(model):
            yield

    @contextmanager
    def trigger_sync_in_backward(self, model: torch.nn.Module) -> Iterator[None]:
        """Make the next backward of `model` synchronise gradients, even inside `no_sync()`.

        Useful when several forward passes run under `no_sync` and the last backward must all-reduce.

        Args:
            model (torch.nn.Module): A prepared model.
        """
        with self._strategy.trigger_sync_in_backward(model):
            yield

    @contextmanager
    def autocast(self, autocast_handler: AutocastKwargs | None = None) -> Iterator[None]:
        """Run the block under this Accelerator's mixed precision, or under the settings of `autocast_handler`.

        Prepared models already run their forward under autocast; use this for computations outside them
        (a loss computed separately), or with `AutocastKwargs(enabled=False)` to compute a block in fp32.

        Args:
            autocast_handler (AutocastKwargs | None): Settings for this block only; None uses the
                Accelerator's.

        Example:
            >>> import torch
            >>> from cadence import Accelerator, AutocastKwargs
            >>> accelerator = Accelerator(mixed_precision="bf16", cpu=True)
            >>> with accelerator.autocast():
            ...     (torch.ones(2, 2) @ torch.ones(2, 2)).dtype
            torch.bfloat16
            >>> with accelerator.autocast(AutocastKwargs(enabled=False)):
            ...     (torch.ones(2, 2) @ torch.ones(2, 2)).dtype
            torch.float32
        """
        with self._strategy.precision.autocast(autocast_handler):
            yield

    def unscale_gradients(self, optimizer: Any = None) -> None:
        """Divide fp16 gradients by the loss scale, once per step; does nothing in other precisions.

        Call it before reading or changing gradients yourself; `clip_grad_norm_` and `clip_grad_value_`
        call it for you.

        Args:
            optimizer (AcceleratedOptimizer | list | None): The prepared optimizer(s) whose gradients to
                unscale; None means all prepared optimizers.

        Raises:
            ValueError: An optimizer that was not passed to `prepare()`.
        """
        self._accumulation.unscale_gradients(optimizer)

    def clip_grad_norm_(
        self,
        parameters: Iterable[torch.Tensor] | torch.Tensor,
        max_norm: float,
        norm_type: float = 2,
    ) -> torch.Tensor:
        """Clip the gradients' total norm to `max_norm`, the way the backend needs it; returns the norm before clipping.

        Unscales fp16 gradients first; with FSDP and DeepSpeed the norm is computed over the sharded
        parameters of every process. Call it only when `sync_gradients` is True (the gradients are
        complete then).

        Args:
            parameters (Iterable[torch.Tensor] | torch.Tensor): The parameters whose gradients to clip,
                usually `model.parameters()`.
            max_norm (float): The largest total norm allowed.
            norm_type (float): The order of the norm (default 2; `float("inf")` for the largest value).

        Returns:
            torch.Tensor: The total norm of the gradients before clipping.

        Example:
            >>> import torch
            >>> from cadence import Accelerator
            >>> accelerator = Accelerator()
            >>> model = accelerator.prepare(torch.nn.Linear(4, 1, bias=False))
            >>> accelerator.backward(model(torch.full((1, 4), 10.0)).sum())
            >>> float(accelerator.clip_grad_norm_(model.parameters(), max_norm=1.0))
            20.0
            >>> round(model.weight.grad.norm().item(), 4)
            1.0
        """
        return self._accumulation.clip_grad_norm_(parameters, max_norm, norm_type)

    def clip_grad_value_(
        self, parameters: Iterable[torch.Tensor] | torch.Tensor, clip_value: float
    ) -> None:
        """Clip every gradient value into `[-clip_value, clip_value]` (after unscaling fp16 gradients).

        Args:
            parameters (Iterable[torch.Tensor] | torch.Tensor): The parameters whose gradients to clip.
            clip_value (float): The largest absolute value allowed.
        """
        self._accumulation.clip_grad_value_(parameters, clip_value)

    @property
    def optimizer_step_was_skipped(self) -> bool:
        """Whether the last optimizer step was skipped because fp16 gradients overflowed.

        When True, a learning-rate scheduler stepped by hand should not advance either.
        """
        return any(optimizer.step_was_skipped for optimizer in self._prepared.optimizers)

    @contextmanager
    def join_uneven_inputs(
        self, joinables: list[Any], even_batches: bool | None = None
    ) -> Iterator[None]:
        """Let processes run different numbers of batches in the block, with torch's `Join` (DDP only).

        Processes that run out of batches early shadow the collectives of the others until all are done.
        With other backends (FSDP, DeepSpeed, ...) it only warns; on one process it does nothing.

        Args:
            joinables (list[torch.distributed.algorithms.Joinable]): The prepared DDP models (and
                `ZeroRedundancyOptimizer`s) taking part.
            even_batches (bool | None): The `even_batches` of the prepared dataloaders inside the block
                (False lets each process read only its own samples, none repeated); None keeps their
                setting.
        """
        from ..training.join import join_uneven_inputs  # deferred: torch's Join, loaded when used

        with join_uneven_inputs(
            joinables,
            even_batches,
            use_distributed=self.use_distributed,
            dataloaders=self._prepared.dataloaders,
            default_even_batches=self.even_batches,
            distributed_type=self.distributed_type,
        ):
            yield

    @contextmanager
    def maybe_context_parallel(self, buffers=None, buffer_seq_dims=None, no_restore_buffers=None):
        """Split the sequence dimension of `buffers` across the context-parallel processes for the block.

        Context parallelism is on when the `ParallelismConfig` has `cp_size > 1` with FSDP2 (or
        DDP with `ACCELERATE_ALLOW_CP_STANDALONE=true`): inside the block the buffers hold this
        rank's share of the sequence and attention runs as ring attention over the cp ranks
        (torch's `context_parallel`). Otherwise the block runs unchanged, the buffers are left as
        they are, and a warning says so once. Enter it again every step and call `backward` inside
        it. Shift the labels before the block and pass `position_ids` as a buffer; see the
        "Long sequences" how-to page.

        Args:
            buffers (list[torch.Tensor] | None): The tensors to shard along their sequence dimension (inputs,
                labels, position ids). Buffers that share memory are refused (the split is in place).
            buffer_seq_dims (list[int] | None): The sequence dimension of each buffer, one per buffer.
            no_restore_buffers (set[torch.Tensor] | None): Buffers not restored to their full length when the
                block ends.

        Raises:
            ValueError: With cp on, `position_ids` missing from the buffers, a sequence length not
                divisible by `cp_size`, buffers sharing memory, or an attention mask that is not
                causal (see docs/differences.md).

        Example:
            >>> import torch
            >>> from cadence import Accelerator
            >>> accelerator = Accelerator()
            >>> ids = torch.arange(8).reshape(1, 8)
            >>> with accelerator.maybe_context_parallel(buffers=[ids], buffer_seq_dims=[1]):
            ...     ids.shape  # no context parallelism here: unchanged
            torch.Size([1, 8])
        """
        with self._strategy.maybe_context_parallel(buffers, buffer_seq_dims, no_restore_buffers):
            yield

    def deepspeed_ulysses_dl_adapter(self, dataloader: Any) -> Any:
        """Wrap a dataloader prepared separately for DeepSpeed Ulysses sequence parallelism.

        Dataloaders passed to `prepare` are wrapped already; this is for one prepared on its own.
        Each batch then becomes one sample split over the sequence-parallel group, with
        `shift_labels` added (the batches need `position_ids`).

        Args:
            dataloader (torch.utils.data.DataLoader): The dataloader to wrap.

        Returns:
            The wrapped dataloader (DeepSpeed's `UlyssesSPDataLoaderAdapter` under Cadence's
            end-of-data bookkeeping).

        Raises:
            ValueError: The Accelerator does not run DeepSpeed with `ParallelismConfig(sp_size > 1)`.
        """
        ulysses_loader = getattr(self._strategy, "ulysses_loader", None)
        if ulysses_loader is None:
            raise ValueError(
                "deepspeed_ulysses_dl_adapter() needs DeepSpeed with ParallelismConfig(sp_size > 1)."
            )
        return ulysses_loader(dataloader)

    def lomo_backward(self, loss: torch.Tensor, learning_rate: float) -> None:
        """Backward and update in one pass with a LOMO or AdaLomo optimizer (package `lomo-optim`).

        Args:
            loss (torch.Tensor): The loss.
            learning_rate (float): The learning rate of this update.

        Raises:
            ImportError: `lomo-optim` is not installed.
            ValueError: No Lomo/AdaLomo optimizer was passed to `prepare()`.
        """
        self._accumulation.lomo_backward(loss, learning_rate)
