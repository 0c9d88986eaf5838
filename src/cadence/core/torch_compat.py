"""Where torch releases differ for Cadence: the one table of the torch APIs Cadence leans on, and the
switches the rest of the package asks instead of comparing versions itself.

`pyproject.toml` declares `torch>=2.6`; `make test-torch TORCH=X` runs the demo and the core tests on
one release (docs/supported-versions.md has the results). Each `TorchApi` row names a torch API (public
ones whose behaviour changed between releases, and every private name Cadence touches:
tests/test_torch_compat.py scans the package and fails on a private torch name missing here), the
first release where it does what Cadence needs (`since`), and what Cadence does on an older one
(`fallback`). Where torch itself computes wrong numbers on a release, Cadence refuses (`refuse_before`
raises `TorchVersionError`, naming the release and the fix) instead of training.
"""

from __future__ import annotations

from dataclasses import dataclass

from packaging.version import Version

from .versions import torch_version

# The lowest release pyproject.toml declares (and `make test-torch` covers).
DECLARED_MINIMUM = "2.6"


@dataclass(frozen=True)
class TorchApi:
    """One torch API Cadence relies on: where it is used, since when it works, and the fallback."""

    name: str  # dotted torch name (a private attribute of an object: "Owner._attr")
    used_by: str  # Cadence module(s), relative to the package
    since: str = DECLARED_MINIMUM  # first torch release on which it works as Cadence needs
    fallback: str = "none needed: present and right on every declared release"


# Features whose torch releases before `since` give wrong results or fail: each is refused there.
# The releases are the first ones VERIFIED right (`make test-torch`, docs/supported-versions.md).
# fully_shard on CPU/gloo: 2.6 fails ('Stream'.record_event); 2.7.1 and 2.8.0 give gradients that
# differ from one process's (fp32 3.7e-5, bf16 0.20, fp16 0.37); 2.9.1 equals one process.
FSDP2_ON_GLOO = "2.9"
# fully_shard on CPU at all, one process included: 2.6 calls Stream.record_event, which a CPU stream
# lacks ("'Stream' object has no attribute 'record_event'"); 2.7.1 runs one process.
FSDP2_ON_CPU = "2.7"
HSDP_ON_GLOO = "2.9"  # 2.7: gloo lacks ReduceOp.AVG; 2.8.0: numbers differ; 2.9.1 right
# FSDP1's sharded state dict with a rank holding no part of a parameter: "Only single local shard"
# on 2.7.1; 2.8.0 and 2.9.1 save and load it exactly (3 processes).
FSDP1_UNEVEN_SHARDED_STATE = "2.8"
# The first release verified to take a listening socket in libuv's TCPStore (2.7 cannot; 2.8 was run
# with the older server, which every declared release has, and trains).
TCPSTORE_LIBUV_LISTEN_FD = "2.9"
# The first release verified whose LocalElasticAgent._shutdown leaves the rendezvous open (2.7 closes it).
AGENT_SHUTDOWN_KEEPS_RENDEZVOUS = "2.9"
# The first release whose ProcessGroup wrapper releases the GIL while its destructor joins the
# backends' worker threads (pytorch#154976; checked: 2.6.0 holds it and deadlocks, 2.8.0 and 2.10.0
# release it; tests/test_torch_compat.py's exit test and docs/supported-versions.md).
GROUP_DESTRUCTOR_RELEASES_GIL = "2.8"

_ELASTIC_AGENT = "torch.distributed.elastic.agent.server.local_elastic_agent.LocalElasticAgent"
_C10D = "torch.distributed.distributed_c10d"
_RDZV = "torch.distributed.elastic.rendezvous.dynamic_rendezvous"

TORCH_APIS: tuple[TorchApi, ...] = (
    # -- the launcher ---------------------------------------------------------------------------
    TorchApi(
        "torch.distributed.TCPStore(master_listen_fd=...)",
        "launch/rendezvous_store.py",
        since=TCPSTORE_LIBUV_LISTEN_FD,
        fallback="the non-libuv server (use_libuv=False): libuv takes no listening socket on 2.7",
    ),
    TorchApi(
        "env:// under torch elastic's agent (TORCHELASTIC_USE_AGENT_STORE, TORCHELASTIC_RESTART_COUNT)",
        "runtime/process_group.py",
        fallback="on every release Cadence connects the worker to the agent's store itself, its keys "
        "under /worker/attempt_<restart>: torch 2.13 connects without that prefix while the static "
        "rendezvous keeps one store, so a restarted group could read the previous attempt's addresses",
    ),
    TorchApi(
        "torch.distributed.run --signals_to_handle",
        "launch/runner.py",
        since="2.10",
        fallback="the agent installs torch's own termination handler for the stop-notice signal "
        "(torch handles SIGTERM, SIGINT, SIGHUP and SIGQUIT itself)",
    ),
    TorchApi(
        "torch.distributed.elastic.multiprocessing.api._terminate_process_handler",
        "launch/elastic_agent.py",
        fallback="used before 2.10 only (see --signals_to_handle)",
    ),
    TorchApi(f"{_ELASTIC_AGENT}._monitor_workers", "launch/elastic_agent.py"),
    TorchApi(f"{_ELASTIC_AGENT}._invoke_run", "launch/elastic_agent.py"),
    TorchApi(
        f"{_ELASTIC_AGENT}._shutdown",
        "launch/elastic_agent.py",
        since=AGENT_SHUTDOWN_KEEPS_RENDEZVOUS,
        fallback="on 2.7 it also closes the rendezvous (the other nodes then die with "
        "RendezvousClosedError after one node's stop notice): the agent hides the handler's "
        "close while torch's shutdown runs; its keyword is `timeout` since 2.12, `is_restart` "
        "before: only what it takes is passed",
    ),
    TorchApi(f"{_ELASTIC_AGENT}._start_workers", "launch/elastic_agent.py"),
    TorchApi(f"{_ELASTIC_AGENT}._initialize_workers", "launch/elastic_agent.py"),
    TorchApi(f"{_ELASTIC_AGENT}._pcontext", "launch/elastic_agent.py"),
    TorchApi(
        "torch.distributed.elastic.multiprocessing.api.PContext._close",
        "launch/elastic_agent.py",
        fallback="its keyword is `timeout` on newer releases: only what it takes is passed",
    ),
    TorchApi(f"{_ELASTIC_AGENT}._rdzv_handler", "launch/elastic_agent.py"),
    TorchApi(f"{_ELASTIC_AGENT}._worker_group", "launch/elastic_agent.py"),
    TorchApi(f"{_ELASTIC_AGENT}._remaining_restarts", "launch/elastic_agent.py"),
    TorchApi(
        f"{_RDZV}.DynamicRendezvousHandler._state_holder",
        "launch/elastic_agent.py",
        fallback="absent: the generation is counted from the restarts used",
    ),
    TorchApi(f"{_RDZV}._Action", "launch/rendezvous_leave.py"),
    TorchApi(
        f"{_RDZV}.DynamicRendezvousHandler._op_executor",
        "launch/rendezvous_leave.py",
        fallback="any of the handler's parts absent: the node is not removed at once, "
        "heartbeat expiry drops it",
    ),
    TorchApi(f"{_RDZV}.DynamicRendezvousHandler._stop_heartbeats", "launch/rendezvous_leave.py"),
    TorchApi(f"{_RDZV}.DynamicRendezvousHandler._heartbeat_lock", "launch/rendezvous_leave.py"),
    TorchApi(f"{_RDZV}.DynamicRendezvousHandler._get_deadline", "launch/rendezvous_leave.py"),
    TorchApi(f"{_RDZV}.DynamicRendezvousHandler._settings", "launch/rendezvous_leave.py"),
    TorchApi(
        "torch.distributed.elastic.multiprocessing.errors.ChildFailedError.failures",
        "launch/runner.py, diagnostics/failure_report.py",
        since="2.10",
        fallback="before 2.10 it omits the ranks the agent stopped itself: the agent's own record "
        "of them (SupervisingAgent.stopped) is added to `cadence launch`'s report. Under plain "
        "torchrun torch's own summary stays torch's: a failing rank still exiting when the agent "
        "noticed a follower's end is missing from it, and its Root Cause names that follower",
    ),
    # -- the process group and the watchdog -------------------------------------------------------
    TorchApi(f"{_C10D}._get_default_group", "diagnostics/watchdog.py, runtime/process_group.py"),
    TorchApi(
        "torch.distributed.ProcessGroup destructor releases the GIL",
        "runtime/process_group.py",
        since=GROUP_DESTRUCTOR_RELEASES_GIL,
        fallback="before 2.8 it joins the backends' worker threads holding the GIL, and a gloo "
        "worker still dropping a finished collective's tensors waits for the GIL: the rank hangs "
        "in destroy_process_group at exit. Cadence holds the group's backends (whose wrappers "
        "release the GIL) while the group goes, and drops them last",
    ),
    TorchApi(f"{_C10D}._get_default_store", "diagnostics/channel.py"),
    TorchApi(
        "torch.distributed.ProcessGroup._get_backend",
        "diagnostics/watchdog.py, runtime/process_group.py",
        fallback="absent or failing: the launch's process-group timeout is used",
    ),
    TorchApi("torch.distributed.ProcessGroupGloo.Options._timeout", "diagnostics/watchdog.py"),
    # -- FSDP -----------------------------------------------------------------------------------
    TorchApi(
        "torch.distributed.fsdp.fully_shard on gloo",
        "strategies/fsdp.py",
        since=FSDP2_ON_GLOO,
        fallback="refused on CPU/gloo (2.6: fully_shard fails; 2.7, 2.8: gradients differ from "
        "one process's); a GPU (NCCL) is not affected",
    ),
    TorchApi(
        "torch.distributed.fsdp.fully_shard on CPU (one process)",
        "strategies/fsdp.py",
        since=FSDP2_ON_CPU,
        fallback="refused on CPU, one process included: 2.6's fully_shard calls "
        "Stream.record_event, which a CPU stream lacks",
    ),
    TorchApi(
        "HSDP (fully_shard on a 2-D mesh) on gloo",
        "strategies/fsdp.py",
        since=HSDP_ON_GLOO,
        fallback="refused on CPU/gloo: 'Cannot use ReduceOp.AVG with Gloo'",
    ),
    TorchApi(
        "FSDP1 SHARDED_STATE_DICT with a rank holding no shard",
        "strategies/sharded_state.py",
        since=FSDP1_UNEVEN_SHARDED_STATE,
        fallback="refused, on every rank before anything is written or loaded: 'Only single "
        "local shard is supported' on 2.7",
    ),
    TorchApi("torch.distributed.algorithms._checkpoint", "strategies/fsdp1.py, fsdp_policy.py"),
    TorchApi(
        "torch.distributed.algorithms._checkpoint.checkpoint_wrapper.CheckpointWrapper."
        "_checkpoint_wrapped_module",
        "strategies/fsdp_policy.py",
    ),
    TorchApi("torch.distributed.fsdp.FullyShardedDataParallel._handle", "strategies/fsdp1.py"),
    TorchApi("torch.distributed.fsdp._flat_param.FlatParameter._fqns", "strategies/fsdp1.py"),
    TorchApi(
        "torch.distributed.checkpoint.state_dict_loader._load_state_dict",
        "strategies/sharded_state.py",
    ),
    TorchApi(
        "torch.distributed.checkpoint.format_utils._EmptyStateDictLoadPlanner",
        "strategies/sharded_state.py",
    ),
    # -- context parallelism --------------------------------------------------------------------
    TorchApi(
        "torch.distributed.tensor.experimental._attention",
        "strategies/context_parallel.py",
        fallback="none needed: set_rotate_method is there from 2.6 (checked on 2.6.0)",
    ),
    TorchApi(
        "torch.distributed.tensor.experimental._context_parallel",
        "strategies/cp_cpu_attention.py",
        since="2.13",
        fallback="context parallelism on CPU refused (cp_cpu_attention.SUPPORTED_TORCH: the exact "
        "releases its ring-attention mapping was checked on; the module is absent on 2.6); CUDA "
        "is not affected",
    ),
    TorchApi(
        "torch.distributed.tensor.DTensor._op_dispatcher",
        "strategies/cp_cpu_attention.py",
        since="2.13",
        fallback="used only by context parallelism on CPU, refused before (see _context_parallel)",
    ),
    TorchApi(
        "torch.distributed.tensor.experimental._context_parallel._attention._templated_ring_attention",
        "strategies/cp_cpu_attention.py",
        since="2.13",
        fallback="used only by context parallelism on CPU, refused before (see _context_parallel)",
    ),
    TorchApi(
        "torch.distributed.tensor.experimental._context_parallel._attention."
        "_templated_ring_attention_backward",
        "strategies/cp_cpu_attention.py",
        since="2.13",
        fallback="used only by context parallelism on CPU, refused before (see _context_parallel)",
    ),
    TorchApi(
        "torch.ops.aten._scaled_dot_product_flash_attention_for_cpu",
        "strategies/cp_cpu_attention.py",
        fallback="none needed (present on 2.6.0); mapped to ring attention only from 2.13",
    ),
    TorchApi(
        "torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward",
        "strategies/cp_cpu_attention.py",
        fallback="none needed (present on 2.6.0); mapped to ring attention only from 2.13",
    ),
    # -- modules, data, serialization ---------------------------------------------------------------
    TorchApi("torch.nn.Module._load_from_state_dict", "checkpointing/state_fit.py"),
    TorchApi("torch.nn.Module._load_state_dict_pre_hooks", "checkpointing/state_fit.py"),
    TorchApi("torch.nn.Module._load_state_dict_post_hooks", "checkpointing/state_fit.py"),
    TorchApi("torch.nn.Module._parameters", "bigmodel/"),
    TorchApi("torch.nn.Module._non_persistent_buffers_set", "bigmodel/sizes.py"),
    TorchApi("torch.utils.data.DataLoader._iterator", "data/loaders.py"),
    TorchApi("torch.utils.data.DataLoader._index_sampler", "data/loaders.py"),
    TorchApi("torch.utils.data.DataLoader._auto_collation", "data/loaders.py"),
    TorchApi("torch.utils.data.RandomSampler._num_samples", "data/prepare.py"),
    TorchApi("torch.optim.lr_scheduler.LRScheduler._last_lr", "checkpointing/state_fit.py"),
    TorchApi(
        "torch.distributed.fsdp.FullyShardedDataParallel._fsdp_wrapped_module",
        "strategies/param_remap.py",
    ),
    TorchApi("torch._dynamo.eval_frame.OptimizedModule._orig_mod", "strategies/param_remap.py"),
    TorchApi("torch._C", "bigmodel/dispatch.py, checkpointing/serialization.py"),
    TorchApi("torch._weights_only_unpickler", "checkpointing/serialization.py"),
    TorchApi(
        "torch.serialization._load",
        "checkpointing/serialization.py",
        fallback="absent: torch.load reads the file",
    ),
    TorchApi("torch._dynamo", "training/model_helpers.py", fallback="absent: nothing to unwrap"),
)


class TorchVersionError(RuntimeError):
    """This torch release cannot do what was asked correctly; the message names the fix."""


def torch_at_least(version: str) -> bool:
    """Whether the installed torch is `version` or newer (pre-releases and local tags included)."""
    return Version(torch_version.base_version) >= Version(version)


def refuse_before(version: str, what: str, why: str, alternative: str = "") -> None:
    """Raise `TorchVersionError` when the installed torch is older than `version`."""
    if torch_at_least(version):
        return
    also = f", or {alternative}" if alternative else ""
    raise TorchVersionError(
        f"{what} needs torch >= {version}; this is torch {torch_version} ({why}). "
        f"Upgrade: pip install 'torch>={version}'{also}."
    )


def api(name: str) -> TorchApi:
    """The table's row for `name` (KeyError when Cadence does not declare it)."""
    for row in TORCH_APIS:
        if row.name == name:
            return row
    raise KeyError(name)


# -- the switches ---------------------------------------------------------------------------------
def tcpstore_listen_fd_options() -> dict[str, bool]:
    """Extra TCPStore keywords for a server given its listening socket (`master_listen_fd`)."""
    return {} if torch_at_least(TCPSTORE_LIBUV_LISTEN_FD) else {"use_libuv": False}


def torchrun_signal_args(names: list[str]) -> list[str]:
    """torchrun's arguments that make its agent handle `names` (empty before 2.10: no such flag;
    `SupervisingAgent` installs the handler itself there)."""
    return ["--signals_to_handle", ",".join(names)] if torch_at_least("2.10") else []


def agent_handles_extra_signals() -> bool:
    """Whether torchrun's agent handles the signals given with --signals_to_handle itself."""
    return torch_at_least("2.10")


def agent_shutdown_closes_rendezvous() -> bool:
    """Whether `LocalElasticAgent._shutdown` may also close the rendezvous (it does on 2.7; the
    agent passes `is_restart` only where `_shutdown` takes it)."""
    return not torch_at_least(AGENT_SHUTDOWN_KEEPS_RENDEZVOUS)


def ranks_without_a_chunk(shapes: dict[str, tuple[int, ...]], world_size: int) -> list[str]:
    """The parameters (by name, from their unsharded `shapes`) of which FSDP1's sharded state dict
    leaves some rank no part: it splits each one with `Tensor.chunk(world_size)` along dim 0, which
    gives fewer chunks than ranks when dim 0 is short (a bias of 2 on 3 ranks: 1 + 1 + nothing)."""
    import torch

    short = []
    for name, shape in shapes.items():
        rows = shape[0] if shape else 1
        chunks = len(torch.empty(rows, device="meta").chunk(world_size)) if rows else 1
        if chunks < world_size:
            short.append(name)
    return short


def failures_include_stopped_ranks() -> bool:
    """Whether `ChildFailedError.failures` lists the ranks the agent stopped itself (2.10 on)."""
    return torch_at_least("2.10")


def group_destructor_releases_gil() -> bool:
    """Whether dropping a ProcessGroup's Python wrapper releases the GIL while its backends' worker
    threads are joined (2.8 on; before, Cadence drops the backends last itself)."""
    return torch_at_least(GROUP_DESTRUCTOR_RELEASES_GIL)
