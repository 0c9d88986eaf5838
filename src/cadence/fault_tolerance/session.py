"""One replica group's fault-tolerant training session on torchft's Manager.

The session owns the Manager (this group's membership in the Lighthouse's quorums), the cross-group
process group, the step's life (begin: the quorum, reused while every group trains, and the heal;
end: gradient average and commit vote), and the reports of quorum changes; heal_state.py holds
what a healing group receives. The façade's preparer hands it
the prepared objects; nothing here reads the Accelerator.
"""

from __future__ import annotations

import atexit
import os
import threading
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch

from ..runtime.process_group import launcher_store_client
from .config import FaultToleranceConfig
from .cross_group import CrossGroupReduce, Finish, StepQuorum
from .gradients import average_across_groups, local_gradient, reduced_in_place
from .heal_state import GroupSizeMismatch, HealState
from .hooks import SessionHook
from .loader import CursorLoader, StepView
from .manager_bind import manager_server_bound_to
from .membership import JobLost, Membership, say
from .script_side import ScriptSide
from .step_share import BLOCKS, contributors, finished, finished_row, one_cut, share_row
from .watchdog import QuorumWatchdog

# torchft keys the Manager writes into the group's store (torchft/manager.py); a restarted group
# clears them so its other ranks never read the previous incarnation's address.
_MANAGER_STORE_KEYS = ("manager_addr", "replica_id")


class FaultTolerantSession(ScriptSide):
    """This replica group's side of the quorum (see the module docstring).

    Args:
        config: the resolved fault-tolerance settings.
        device: this process's device (the cross-group backend follows it: gloo on CPU, NCCL on CUDA).
        group_rank / group_world_size: this process's rank and the process count of its group.
        group_barrier: waits for every rank of the group (None with one process).
        syncing: whether the current micro-batch ends the optimizer step's window (default: each
            does).
        registered: the objects registered for checkpointing (the Accelerator's list, read when a
            heal sends or applies): they heal as the model does.
    """

    def __init__(
        self,
        config: FaultToleranceConfig,
        *,
        device: torch.device,
        group_rank: int,
        group_world_size: int,
        group_barrier: Callable[[], None] | None,
        syncing: Callable[[], bool] | None = None,
        registered: list[Any] | None = None,
    ) -> None:
        from torchft.checkpointing.pg_transport import PGTransport
        from torchft.manager import Manager
        from torchft.process_group import ProcessGroupGloo, ProcessGroupNCCL

        if "MASTER_ADDR" not in os.environ or "MASTER_PORT" not in os.environ:
            raise RuntimeError(
                "fault tolerance needs the replica group's store (MASTER_ADDR / MASTER_PORT): start "
                "the script with `cadence launch --fault_tolerance ...`"
            )
        self.config = config
        self.device = device
        self.group_rank = group_rank
        self.group_world_size = group_world_size
        timeout = timedelta(seconds=config.timeout)
        pg = ProcessGroupNCCL(timeout) if device.type == "cuda" else ProcessGroupGloo(timeout)
        # The heal travels over the cross-group process group: no extra listener (torchft's HTTP
        # transport would listen on every interface).
        transport = PGTransport(pg, timeout=timeout, device=device)
        self._store: Any = None  # the group's store at its root, once needed
        if group_barrier is not None:
            if group_rank == 0:
                # torchft reads them at the root of the group's store (its own client, no prefix);
                # the default group's store would prefix them ("default_pg/") and miss them.
                store = self._group_store()
                for key in _MANAGER_STORE_KEYS:
                    store.delete_key(key)
            group_barrier()
        with manager_server_bound_to(config.host):
            self.manager = Manager(
                pg=pg,
                load_state_dict=None,
                state_dict=None,
                min_replica_size=config.min_replicas,
                # Each quorum-forming step chooses (`_quorum_for`): one drawn on the previous
                # quorum forms its own beside the forward pass; any other waits for it first.
                use_async_quorum=True,
                timeout=timeout,
                quorum_timeout=timedelta(seconds=config.quorum_timeout),
                connect_timeout=timeout,
                rank=group_rank,
                world_size=group_world_size,
                lighthouse_addr=config.lighthouse,
                replica_id=f"cadence_group_{config.replica_group}",
                hostname=config.host,
                checkpoint_transport=transport,
            )
        self.models: list[torch.nn.Module] = []
        self.optimizers: list[Any] = []
        self.schedulers: list[Any] = []
        self.loaders: list[CursorLoader] = []
        self.counters: list[Any] = []  # the accumulation counter (attach_counter)
        # What a healing group receives: the lists above, read when a heal sends or applies.
        self._heal = HealState(
            config.replica_group,
            group_rank,
            group_world_size,
            models=self.models,
            optimizers=self.optimizers,
            schedulers=self.schedulers,
            loaders=self.loaders,
            counters=self.counters,
            registered=registered,
        )
        self.manager.register_state_dict_fn("cadence", self._heal.load, self._heal.send)
        self.membership = Membership(config, group_rank, self.manager, self._group_store)
        self.reducer = CrossGroupReduce(self.manager, pg)
        self._view: StepView | None = None
        self._closed = False
        self._syncing = syncing or _always
        # Gradients whose cross-group average started during the backward pass: id -> finish.
        self._early: dict[int, Finish] = {}
        self._early_on = True  # off for good once a gradient was accumulated after its start
        self._averaged_ids: set[int] = set()  # the optimizer's parameters, by id
        # The open step's averaged share rows and quorum, once its gradients were averaged.
        self._summed: list[float] | None = None
        self._quorum: StepQuorum | None = None
        # The quorum the next step's batch is drawn on, (participating replica rank, replica
        # participants), when the last step committed with every group of the job in it; None:
        # the next step waits for its quorum. (With a group missing, steps wait: a group that
        # joins then draws on the same quorum as the others, and heals without a discard.)
        self._basis: tuple[int, int] | None = None
        # The open step's basis when its own quorum forms beside it (None: its quorum is known:
        # waited for, or the last one reused).
        self._drawn_on: tuple[int, int] | None = None
        self._reused = False  # the open step reuses the last quorum (no Lighthouse round trip)
        self._sit_out = False  # the open step's gradients predate a heal: it sends zeros
        self._gathers = False  # gather_for_metrics seen: every step waits for its quorum
        # torchft reads the quorum mode from this attribute at each quorum; without it (another
        # torchft release) every step waits for its quorum, as torchft's synchronous mode does.
        # Without the job's group count, a step cannot tell a full quorum: every step waits.
        self._can_overlap = bool(config.replica_groups) and isinstance(
            getattr(self.manager, "_use_async_quorum", None), bool
        )
        self.discarded_steps = 0
        self.overlapped_steps = 0  # steps drawn on the previous quorum while theirs formed
        self.reused_steps = 0  # steps that reused the previous quorum without asking for one
        self.early_steps = 0  # steps whose large gradients started averaging during backward
        self._committed_ranks = group_world_size  # ranks that trained the last committed step
        self.committed_steps = 0
        self._finishing = False  # this group's script ended: its steps say so, contribute nothing
        # A script that ends without end_training() tells the others too (only if it ended well);
        # held strongly: the script's Accelerator is gone by then, the group's membership is not.
        # It runs with the interpreter's thread shutdown, before the executors the Manager uses
        # are shut down (concurrent.futures' own exit hook; those registered later run first).
        register = getattr(threading, "_register_atexit", atexit.register)
        register(self._finish_at_exit)
        # One thread for the session's life, not one per step: it says why a quorum is late.
        self._watchdog = QuorumWatchdog(
            max(2.0, 3 * config.heartbeat_timeout), self.membership.say_waiting
        )

    def _group_store(self) -> Any:
        if self._store is None:
            self._store = launcher_store_client(timedelta(seconds=self.config.timeout))
        return self._store

    # -- one step -------------------------------------------------------------------------------
    def begin_step(self, after_gradients: bool = False) -> StepView:
        """Open the step: start its quorum and say which slice of the data this rank takes;
        idempotent.

        A step after a committed one with every group of the job in it reuses that step's quorum
        without asking the Lighthouse, except every `quorum_every` steps, when its own quorum is
        formed while the forward and backward passes run. Either way the commit checks, in the
        gradient all-reduce itself, that every contributor cut the batch from one quorum at one
        step (step_share.py; otherwise every group discards the step and its samples are drawn
        again). A failure needs no quorum to be seen: the all-reduce with a lost group fails, the
        step is discarded, and the next one waits for a new quorum. The first step, a step after a
        discarded one or one with a group missing wait for their quorum (and a heal from a peer)
        before drawing, as does every quorum-forming step once `gather_for_metrics` is used.

        A prepared DataLoader opens the step before drawing its batch; without one, the prepared
        model's first forward pass with gradients does; the optimizer step, last
        (`after_gradients`: a heal then makes the step's gradients stale, and the group sits the
        step out).
        """
        self.phantom_step = False  # a real draw: any stand-in batch before it is over
        if self._view is not None:
            return self._view
        step = self.manager.current_step()
        self._sit_out = False
        self._reused = self._basis is not None and step % self.config.quorum_every != 0
        if self._basis is not None and self._reused:
            # The quorum is the last step's: nothing to wait for, nobody to heal.
            self._drawn_on = None
            self.reused_steps += 1
            replica_rank, participants = self._basis
        else:
            replica_rank, participants = self._quorum_for(step, after_gradients)
        self._view = StepView(
            participants=participants * self.group_world_size,
            index=replica_rank * self.group_world_size + self.group_rank,
            most=(self.config.replica_groups or participants) * self.group_world_size,
        )
        return self._view

    def _quorum_for(self, step: int, after_gradients: bool) -> tuple[int, int]:
        """Start the step's quorum (waiting for it unless it may form beside the step) and
        return what the batch is cut with: (participating replica rank, replica participants)."""
        basis = None if self._gathers or not self._can_overlap else self._basis
        # Only a quorum formed beside the forward pass can send a heal while the step draws; a
        # waited-for one sends before this returns, from the state as it stands.
        self._heal.capture_moving(basis is not None)
        if self._can_overlap:
            self.manager._use_async_quorum = basis is not None
        self._watchdog.arm(step)
        try:
            self.manager.start_quorum()
            if basis is None:
                self.membership.wait_for_every_group()
                self.membership.check_someone_holds_the_job(self.committed_steps)
        except GroupSizeMismatch:  # found at a heal: said as it is, not as a missing quorum
            raise
        except JobLost:
            raise
        except Exception as error:
            raise self._no_quorum(step, error) from error
        finally:
            self._watchdog.disarm()
        self._drawn_on = basis
        self.overlapped_steps += basis is not None
        healed = self._heal.healed_from is not None
        self._say_healed()
        # The gradients of this step were computed before the heal replaced the weights: the group
        # sends zeros (its peers see it missing and discard the step too, rather than wait for a
        # collective it skipped) and discards the step.
        self._sit_out = healed and after_gradients
        if basis is not None:
            return basis
        return self.manager.participating_rank() or 0, self.manager.num_participants()

    def _no_quorum(self, step: int, error: BaseException) -> RuntimeError:
        return RuntimeError(
            f"replica group {self.config.replica_group}: no quorum within "
            f"{self.config.quorum_timeout:g} s at step {step} (fewer than min_replicas="
            f"{self.config.min_replicas} groups alive, or the Lighthouse at "
            f"{self.config.lighthouse} unreachable); this process stops and its agent "
            f"restarts it: {error}"
        )

    def _say_healed(self) -> None:
        if self._heal.healed_from is not None and self.group_rank == 0:
            say(
                f"group {self.config.replica_group} healed from group {self._heal.healed_from} "
                f"at step {self.manager.current_step()}"
            )
        self._heal.healed_from = None

    def _wait_for_quorum(self) -> None:
        """Wait for the open step's quorum (formed beside the forward pass when overlapped)."""
        step = self.manager.current_step()
        self._watchdog.arm(step)
        try:
            self.manager.wait_quorum()
        except Exception as error:
            raise self._no_quorum(step, error) from error
        finally:
            self._watchdog.disarm()

    def _share_row(self, quorum: StepQuorum) -> torch.Tensor:
        """This group's row of the open step (step_share.py); zeros without the job's group count."""
        groups = self.config.replica_groups
        if not groups:
            return torch.zeros(BLOCKS, dtype=torch.float32)
        if self._finishing:
            return finished_row(groups, self.config.replica_group)
        view = self._view
        assert view is not None, "a step is open"
        return share_row(
            groups,
            self.config.replica_group,
            cut_with=view.participants // self.group_world_size,
            rank=view.index // self.group_world_size,
            counted=quorum.participants,
            step=self.manager.current_step(),
            restarted=self.membership.restarted,
        )

    def _one_cut(self, summed: torch.Tensor | list[float]) -> bool:
        groups = self.config.replica_groups
        # Without the group count every step waits for its quorum: the cuts agree by construction.
        return one_cut(summed, groups) if groups else True

    def average_gradients(self) -> None:
        """Average the step's gradients across the quorum now, once a step: at the optimizer step,
        or earlier when they are read (`clip_grad_norm_` / `clip_grad_value_` clip the average
        of every participant's gradients, as under DDP, not this group's alone).

        Raises:
            RuntimeError: no model was prepared (a healing group could not receive its weights).
        """
        if self._summed is not None or not self.optimizers or self.phantom_step:
            return  # averaged already; no prepared optimizer; or a stand-in batch's step
        if not self.models:
            raise RuntimeError(
                f"replica group {self.config.replica_group}: fault tolerance needs the model "
                "prepared with the optimizer (accelerator.prepare(model, optimizer, ...)): a group "
                "that heals receives the prepared model's weights, and its forward pass opens the "
                "step before the gradients are computed"
            )
        self.begin_step(after_gradients=True)
        if not self._reused:
            self._wait_for_quorum()
        # The share row rides in the gradient all-reduce: every contributing group learns the
        # step's members and how each cut the batch, without a collective of its own.
        basis = self._basis if self._reused else None
        # A reused quorum is the last step's, in which this group participated.
        quorum = StepQuorum(basis[1], True) if basis is not None else self.reducer.quorum()
        row = self._share_row(quorum)
        parameters = self._parameters()
        if self._finishing:
            # Zeros in every gradient's place: the collectives match a training group's step.
            for parameter in parameters:
                if parameter.requires_grad:
                    parameter.grad = torch.zeros_like(parameter)
        if self._sit_out:
            row.zero_()
            for parameter in parameters:
                if parameter.grad is not None:
                    parameter.grad.zero_()
        early, self._early = self._early, {}
        self.early_steps += bool(early)
        averaged = average_across_groups(
            self.reducer, quorum, parameters, row, self.device, started=early
        )
        self._quorum = quorum
        self._summed = (averaged * quorum.participants).tolist()  # averaged over torchft's count

    def commit(self) -> bool:
        """Average the gradients across the quorum (unless done already this step) and vote;
        True when the step commits.

        Raises:
            RuntimeError: the optimizer stepped during an evaluation pass (a DataLoader iterated
                while the prepared model was in eval mode).
        """
        if self.phantom_step:
            return self.end_phantom()
        if any(loader.evaluating for loader in self.loaders):
            raise RuntimeError(
                f"replica group {self.config.replica_group}: the optimizer stepped during a pass "
                "over a prepared DataLoader that started while the prepared model was in eval "
                "mode. Under fault tolerance such a pass is an evaluation pass (each replica group "
                "reads all of it, none of it through the exactly-once cursor), so training on it "
                "would repeat samples across the groups. Call model.train() before iterating a "
                "training DataLoader (docs: Training through failures)"
            )
        if self.job_finished and not self._finishing:
            # The job's training is over: nothing commits any more, nothing drawn is consumed.
            self._view, self._summed, self._quorum = None, None, None
            for loader in self.loaders:
                loader.end_step(False)
            return False
        self.average_gradients()
        summed, quorum = self._summed, self._quorum
        assert summed is not None and quorum is not None
        self._summed = self._quorum = None
        groups = self.config.replica_groups or 0
        basis = self._basis if self._reused else None
        if groups and finished(summed, groups):
            done = finished(summed, groups)
            self.manager.report_error(RuntimeError(f"replica groups {done} finished their scripts"))
        elif self._sit_out:
            self.manager.report_error(
                RuntimeError("healed after the gradients were computed; step discarded")
            )
        elif not self._one_cut(summed):
            self.manager.report_error(
                RuntimeError(
                    "the groups cut the step's batch differently (the quorum changed after it "
                    "was drawn, or a group is a step behind)"
                )
            )
        elif not quorum.participating:
            # Healing beside an overlapped quorum: its peers trained the step without it, and
            # the heal (applied by the vote) restores the step's start; the next step heals
            # again, before drawing.
            self.manager.report_error(RuntimeError("healing; this group sat the step out"))
        committed = self._vote(quorum)
        participants = quorum.participants
        self._view = None
        for loader in self.loaders:
            loader.end_step(committed)
        step = self.manager.current_step()
        drawn = basis if basis is not None else (self.manager.participating_rank(), participants)
        everyone = bool(groups) and len(contributors(summed, groups)) == groups
        self._basis = drawn if committed and everyone and drawn[0] is not None else None
        self._heal.capture_moving(False)
        first = self.committed_steps == 0
        self.membership.note_step(summed, step, committed, first, self._finishing)
        if committed:
            self.committed_steps += 1
            self._committed_ranks = participants * self.group_world_size
        else:
            self.discarded_steps += 1
            if self.group_rank == 0 and not (self._finishing or self.job_finished):
                error = self.manager.errored()
                why = f": {str(error.original_exception).splitlines()[0]}" if error else ""
                say(
                    f"replica group {self.config.replica_group} discarded step {step} "
                    f"({participants} of min {self.config.min_replicas} groups{why}); "
                    "its samples are drawn again"
                )
        self._say_healed()  # a heal applied by the vote (beside an overlapped quorum)
        return committed

    def _vote(self, quorum: StepQuorum) -> bool:
        """The group's commit vote: torchft's (`should_commit`), except for a group of one
        process on a reused quorum with nothing gone wrong, whose vote is its own word.

        torchft's vote gathers the group's ranks through its ManagerServer (a round trip even for
        one rank) and commits when none failed; then it counts the step. A lone rank with no error
        on a quorum nobody is healing in decides the same, and counts the step through the
        Manager's own state (`load_state_dict`). Any failure goes through torchft's vote.
        """
        manager = self.manager
        clean = (
            self._reused
            and self.group_world_size == 1
            and manager.errored() is None
            and self.reducer.process_group.errored() is None
            and quorum.participating
            and quorum.participants >= self.config.min_replicas
        )
        if not clean:
            return manager.should_commit()
        counted = manager.state_dict()
        manager.load_state_dict(
            {
                "step": counted["step"] + 1,
                "batches_committed": counted["batches_committed"] + quorum.participants,
            }
        )
        return True

    # -- the prepared objects, handed over by the preparer ------------------------------------------
    def attach_model(self, model: torch.nn.Module) -> None:
        """A prepared model: its weights travel to a healing group, and its first forward pass
        with gradients opens the step when no prepared DataLoader did (a script that iterates its
        own batches), so that a heal lands before the gradients are computed."""
        self.models.append(model)
        model.register_forward_pre_hook(SessionHook(self, "_open_step_before_forward"))

    def _open_step_before_forward(self, module: torch.nn.Module, args: Any) -> None:
        del module, args  # the hook's signature
        # Not for a stand-in batch (script_side.py): its step trains nothing.
        if (
            self._view is None
            and not (self._closed or self.phantom_step)
            and torch.is_grad_enabled()
        ):
            self.begin_step()

    def attach_optimizer(self, optimizer: Any) -> None:
        """The prepared optimizer: it steps only when the quorum commits (its `step_gate`)."""
        if self.optimizers:
            raise ValueError(
                "fault tolerance commits one optimizer step per training step: prepare a single "
                "optimizer (put several parameter groups in it)"
            )
        self.optimizers.append(optimizer)

        optimizer.step_gate = self.commit
        self._averaged_ids = {id(p) for p in self._parameters()}
        if self.group_world_size == 1:
            # Alone in its group, a parameter's gradient is final when autograd has accumulated it
            # (no DDP to average it inside the group first): a large one can start its average then.
            for parameter in self._parameters():
                if parameter.requires_grad:
                    parameter.register_post_accumulate_grad_hook(SessionHook(self, "_start_early"))

    def _start_early(self, parameter: torch.Tensor) -> None:
        """Start a large gradient's cross-group average while the backward pass goes on (as DDP
        starts its buckets), on a step that reuses the last quorum: the quorum is known before the
        backward pass and every group reuses it alike, so every group starts the same collectives
        in the same (autograd's) order. On other steps, and on micro-batches that do not end the
        window, the average waits for the optimizer step.

        A second backward pass in the same micro-batch (two losses) would add to a gradient its
        average is reading: that step is discarded (on every group: they run the same script) and
        averages wait for the optimizer step from then on."""
        if not self._early_on or not self._reused or self._view is None or self._summed is not None:
            return
        if id(parameter) not in self._averaged_ids:
            return  # not the optimizer's (a copy of the model, an EMA's)
        if id(parameter) in self._early:
            self._early_on = False
            self.manager.report_error(
                RuntimeError("a gradient was accumulated again after its average started")
            )
            if self.group_rank == 0:
                say(
                    f"replica group {self.config.replica_group}: a gradient was accumulated again "
                    "after its average across the groups started (two backward passes in one "
                    "step): the step is discarded and, from now on, gradients are averaged at the "
                    "optimizer step"
                )
            return
        grad = parameter.grad
        # A DTensor shard (FSDP2) or a gradient the buckets flatten waits for the optimizer step.
        if grad is None or local_gradient(grad) is not grad:
            return
        if not reduced_in_place(grad, self.device):
            return
        if not self._syncing():
            return
        assert self._basis is not None
        self._early[id(parameter)] = self.reducer.start(grad, StepQuorum(self._basis[1], True))

    def _parameters(self) -> list[torch.nn.Parameter]:
        """The prepared optimizer's parameters: the gradients a step averages."""
        return [p for group in self.optimizers[0].param_groups for p in group["params"]]

    def committed_ranks(self) -> int:
        """The ranks, over every participating group, that trained the last committed step: the
        prepared scheduler advances that many steps for it (as Accelerate's advances once per
        process), so the schedule counts batches as one process would."""
        return self._committed_ranks

    def attach_scheduler(self, scheduler: Any) -> None:
        """A prepared scheduler: it follows committed steps (the optimizer's skip flag); its state
        travels to a healing group."""
        self.schedulers.append(scheduler)

    def gather_for_metrics(self, data: Any, use_gather_object: bool, process_index: int) -> Any:
        """The open step's results of every participating rank across the groups, in participating
        order: the step's global batch, each sample once (metrics.py).

        Raises:
            RuntimeError: outside a step (after the optimizer stepped, the batch's step is closed),
                or when a replica group was lost during the gather (its rows would be missing).
        """
        from .metrics import gather_step  # deferred: loaded on the first gather

        view = self._view
        where = f"process {process_index} of replica group {self.config.replica_group}"
        if view is None:
            raise RuntimeError(
                f"{where}: gather_for_metrics over a DataLoader prepared under fault tolerance "
                "gathers the samples of the step that is open, and none is: the optimizer has "
                "stepped (the step closed), so the batch's step is over. Call gather_for_metrics "
                "before optimizer.step(), or in an evaluation loop (docs: Training through "
                "failures, limits)"
            )
        device = self.device

        def sum_in_group(tensor: torch.Tensor) -> None:
            if self.group_world_size > 1:
                moved = tensor.to(device)
                torch.distributed.all_reduce(moved, op=torch.distributed.ReduceOp.SUM)
                tensor.copy_(moved.cpu())

        def sum_across_groups(tensor: torch.Tensor) -> None:
            moved = tensor.to(device)
            self.reducer.start(moved, self.reducer.quorum(), average=False)()
            if self.manager.errored() is not None:
                raise RuntimeError(
                    f"{where}: a replica group was lost during gather_for_metrics at step "
                    f"{self.manager.current_step()}, so its samples are missing from the "
                    "result; the step is discarded and its samples drawn again (gather them "
                    "then)"
                )
            tensor.copy_(moved.cpu())

        # A gather needs the step's participants before its collectives: from now on every step
        # waits for its quorum before drawing. This one, if drawn on the previous quorum, checks
        # first (in one small all-reduce every group makes) that no participant's share changed.
        self._gathers = True
        sitting_out = False
        if self._drawn_on is not None:
            self._wait_for_quorum()
            check = self._share_row(self.reducer.quorum())
            sum_across_groups(check)
            if not self._one_cut(check):
                self.manager.report_error(
                    RuntimeError("the quorum changed after the step's batch was drawn")
                )
                raise RuntimeError(
                    f"{where}: the replica groups' quorum changed after this step's batch was "
                    f"drawn (step {self.manager.current_step()}), so the step is discarded and "
                    "its samples drawn again; gather them then (later steps wait for their "
                    "quorum before drawing)"
                )
            sitting_out = not self.manager.is_participating()
            if sitting_out:  # healing: its rows add nothing (torchft sends zeros); it follows
                view = StepView(
                    participants=self.manager.num_participants() * self.group_world_size,
                    index=self.group_rank,
                )
        gathered = gather_step(
            data,
            use_gather_object,
            view=view,
            sum_in_group=sum_in_group,
            sum_across_groups=sum_across_groups,
        )
        if sitting_out:
            raise RuntimeError(
                f"{where}: this replica group is healing from a peer during step "
                f"{self.manager.current_step()} and sits it out, so it has no samples of the "
                "step to gather; its next step trains again"
            )
        return gathered

    def writes_checkpoints(self) -> bool:
        """Whether this group writes `save_state`: every group holds the same committed state,
        so one writes it: the first group of the last committed step that never restarted
        (`checkpoint_writer`), else the first participant of the last quorum; never a restarted
        group still passing through what the job did before it came back."""

        def before_any_commit() -> bool:
            if self.committed_steps + self.discarded_steps == 0 and self._view is None:
                return self.config.replica_group == 0  # no quorum yet: every group holds the start
            return self.manager.participating_rank() == 0

        return self.membership.writes_checkpoints(self.catching_up(), before_any_commit)

    def shutdown(self) -> None:
        """Leave the quorum: stop this group's torchft servers."""
        self._closed = True
        self._watchdog.disarm()
        self.manager.shutdown(wait=False)


def _always() -> bool:
    return True
