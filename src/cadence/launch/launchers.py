"""Start a training function in several processes from Python: `notebook_launcher` and `debug_launcher`.

Both fork workers through PyTorch's elastic agent (torch.distributed.launcher), which supervises them;
Cadence only describes the job.
"""

from __future__ import annotations

import os
import socket
import uuid
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

from ..core.settings import LAUNCH_CONFIG_ENV, encode_launch_config, env_bool
from ..diagnostics.failure_report import (
    failures_from_elastic,
    failures_from_error_files,
    format_failure_summary,
)
from ..diagnostics.signing import JOB_TOKEN_ENV, new_job_token
from ..precision.choice import check_precision_supported, resolve_mixed_precision
from ..runtime.cuda_probe import (
    NVML_CHECK_ENV,
    cuda_compute_capability,
    cuda_device_count,
    cuda_initialized,
)
from ..runtime.hardware import usable_cpu_count, visible_gpu_count
from ..runtime.state import AcceleratorState, PartialState
from ..xla.runtime import planned_device_kind, xla_requested
from .bounds import OVERSUBSCRIBE_ENV, notebook_launcher_problems
from .env import PrepareForLaunch
from .rendezvous_store import store_bound_to


class WorkerProcessesFailed(ChildFailedError, RuntimeError):
    """A worker process of notebook_launcher / debug_launcher failed; the message names the root cause.

    It is torch's `ChildFailedError` (what Accelerate's notebook_launcher raises, and what scripts
    catch), with `name` and `failures` from torch, and Cadence's summary as its message."""

    def __init__(
        self, summary: str, name: str = "", failures: dict[int, Any] | None = None
    ) -> None:
        self.name = name
        self.failures = dict(failures or {})
        Exception.__init__(self, summary)

    def __str__(self) -> str:
        return str(self.args[0])


@contextmanager
def _environment(**values: str):
    saved = {key: os.environ.get(key) for key in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


@contextmanager
def _nothing():
    yield None, None


def _check_counts(
    num_processes: int,
    num_nodes: Any = 1,
    node_rank: Any = 0,
    port: Any = 0,
    max_restarts: Any = 0,
    monitor_interval: Any = 0.1,
    cpu_only: bool = False,
) -> None:
    """Refuse counts that cannot work (or would fork without end) before any process starts."""
    problems = notebook_launcher_problems(
        num_processes,
        num_nodes,
        node_rank,
        port,
        max_restarts,
        monitor_interval,
        0 if cpu_only else visible_gpu_count(),
        usable_cpu_count(),
        env_bool(OVERSUBSCRIBE_ENV),
    )
    if problems:
        raise ValueError("Cannot launch: " + "; ".join(problems) + ". Nothing was started.")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _refuse_initialised_cuda() -> None:
    """Refuse to fork when this process already holds a CUDA context (checked before any worker starts)."""
    if AcceleratorState._shared_state:
        raise ValueError(
            "To launch a multi-process training from your notebook, the `Accelerator` should only be "
            "initialized inside your training function. Restart your notebook and make sure no cell "
            "initializes an `Accelerator`."
        )
    if cuda_initialized():
        raise RuntimeError(
            "Could not start distributed processes: CUDA has already been initialized in this process "
            "(the notebook), so the forked workers cannot use it (they would fail with 'Cannot re-initialize "
            "CUDA in forked subprocess'). Restart your notebook and keep every CUDA call (`.cuda()`, "
            "`.to('cuda')`, `torch.cuda.*`, imports that initialize CUDA) inside your training function."
        )


def _named(function: Callable[..., Any]) -> Callable[..., Any]:
    """`function`, or for a callable without `__name__`/`__qualname__` (a functools.partial, a
    callable object) a partial of it that has them: torch's elastic agent names the job after the
    entrypoint."""
    if hasattr(function, "__name__") and hasattr(function, "__qualname__"):
        return function
    import functools

    named = functools.partial(function)
    name = getattr(getattr(function, "func", None), "__name__", type(function).__name__)
    named.__name__ = named.__qualname__ = name  # type: ignore[attr-defined]
    return named


@dataclass(frozen=True)
class _AgentOptions:
    """How the elastic agent meets the other machines and supervises its workers (the rendezvous and
    agent arguments of `notebook_launcher`; the defaults are one machine, as `debug_launcher` runs)."""

    master_addr: str
    port: int | str
    node_rank: int = 0
    num_nodes: int = 1
    rdzv_backend: str = "static"
    rdzv_endpoint: str = ""
    rdzv_conf: dict[str, Any] | None = None
    rdzv_id: str = "none"
    max_restarts: int = 0
    monitor_interval: float = 0.1
    log_line_prefix_template: str | None = None


def _launch_with_elastic_agent(
    function: Callable[..., Any],
    args: tuple[Any, ...],
    *,
    num_processes: int,
    settings: dict[str, Any],
    agent: _AgentOptions,
) -> None:
    import shutil
    import tempfile

    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    log_dir = tempfile.mkdtemp(prefix="cadence-launch-")
    rdzv_configs = dict(agent.rdzv_conf or {})
    if agent.rdzv_backend == "static":
        rdzv_configs.setdefault("rank", agent.node_rank)
    config = LaunchConfig(
        min_nodes=agent.num_nodes,
        max_nodes=agent.num_nodes,
        nproc_per_node=num_processes,
        run_id=agent.rdzv_id if agent.rdzv_id != "none" else uuid.uuid4().hex[:8],
        rdzv_endpoint=agent.rdzv_endpoint or f"{agent.master_addr}:{agent.port}",
        rdzv_backend=agent.rdzv_backend,
        rdzv_configs=rdzv_configs,
        max_restarts=agent.max_restarts,
        monitor_interval=agent.monitor_interval,
        start_method="fork",
        log_line_prefix_template=agent.log_line_prefix_template,
        logs_specs=DefaultLogsSpecs(log_dir=log_dir),
    )
    # The watchdog's signing secret goes to the forked workers through the environment only. Several
    # machines must share one: only a CADENCE_JOB_TOKEN set by the user can be (else: unsigned records).
    token = os.environ.get(JOB_TOKEN_ENV) or (new_job_token() if agent.num_nodes == 1 else "")
    # The static rendezvous keeps its store on this port: listen on the master address only.
    hosts_store = (
        agent.rdzv_backend == "static"
        and agent.node_rank == 0
        and not agent.rdzv_endpoint
        and int(agent.port) != 0
    )
    with (
        _environment(
            **{LAUNCH_CONFIG_ENV: encode_launch_config(settings)},
            MASTER_ADDR=agent.master_addr,
            MASTER_PORT=str(agent.port),
            OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"),
            **({JOB_TOKEN_ENV: token} if token else {}),
            # Whatever asks torch about CUDA in this process while the agent runs (torch's own agent
            # included) asks NVML, so the parent never creates the CUDA context that would break fork.
            **{NVML_CHECK_ENV: "1"},
        ),
        store_bound_to(agent.master_addr, int(agent.port), agent.num_nodes > 1)
        if hosts_store
        else _nothing(),
    ):
        try:
            elastic_launch(config=config, entrypoint=_named(function))(*args)
            # The workers' logs are only worth keeping when the failure summary points at them.
            shutil.rmtree(log_dir, ignore_errors=True)
        except ChildFailedError as error:
            # torch names the lowest failed rank; the rank that failed *first* is the one to report.
            failures = failures_from_error_files(log_dir) or failures_from_elastic(error)
            summary = format_failure_summary(
                failures, list(range(num_processes)), log_dir=log_dir, title="notebook_launcher"
            )
            raise WorkerProcessesFailed(summary, error.name, error.failures) from error


def _launch_on_xla(
    function: Callable[..., Any],
    args: tuple[Any, ...],
    num_processes: int | None,
    mixed_precision: str,
) -> None:
    """`function(*args)` on this host's XLA devices through `xmp.spawn` (forked), as Accelerate does
    on a TPU runtime; `num_processes=1` runs one process."""
    if AcceleratorState._shared_state:
        raise ValueError(
            "To train on TPU in Colab or Kaggle Kernel, the `Accelerator` should only be initialized inside "
            "your training function. Restart your notebook and make sure no cells initializes an "
            "`Accelerator`."
        )
    check_precision_supported(mixed_precision, device_type="xla")
    import torch_xla.distributed.xla_multiprocessing as xmp  # optional dependency

    record = {"mixed_precision": mixed_precision, "use_xla": True, "distributed_type": "XLA"}
    on_tpu = planned_device_kind() == "TPU"
    print(
        "Launching a training on TPU cores." if on_tpu else "Launching a training on XLA devices."
    )
    with _environment(**{LAUNCH_CONFIG_ENV: encode_launch_config(record)}):
        xmp.spawn(
            PrepareForLaunch(function, "XLA"),
            args=args,
            nprocs=1 if num_processes == 1 else None,
            start_method="fork",
        )


def notebook_launcher(
    function: Callable[..., Any],
    args: tuple[Any, ...] = (),
    num_processes: int | None = None,
    mixed_precision: str = "no",
    use_port: str = "29500",
    master_addr: str = "127.0.0.1",
    node_rank: int = 0,
    num_nodes: int = 1,
    rdzv_backend: str = "static",
    rdzv_endpoint: str = "",
    rdzv_conf: dict[str, Any] | None = None,
    rdzv_id: str = "none",
    max_restarts: int = 0,
    monitor_interval: float = 0.1,
    log_line_prefix_template: str | None = None,
) -> None:
    """Run `function(*args)` in `num_processes` processes from a notebook (or any Python code), and wait for them.

    The processes are forked through PyTorch's elastic agent, as `cadence launch` starts them: on a
    machine with GPUs, one per GPU with NCCL; otherwise CPU processes with gloo. Create the Accelerator
    inside `function`, not in the notebook (its state cannot be forked). Everything is checked before a
    process starts, and when a worker fails, every worker is stopped and the error names the rank that
    failed first, with its exception.

    Args:
        function (Callable): The training function; it runs in every process.
        args (tuple): The arguments passed to `function` (default none).
        num_processes (int | None): How many processes on this machine. None or 1 runs `function` in
            this process. At most one per GPU on a GPU machine, else 8 per CPU core
            (`CADENCE_OVERSUBSCRIBE=1` lifts that limit); more raises ValueError.
        mixed_precision (str): "no" (default), "fp16", "bf16" or "fp8", as the Accelerators inside get
            it. An unknown name raises ValueError; fp8 without a suitable GPU raises RuntimeError.
        use_port (str): The port of the rendezvous (default "29500").
        master_addr (str): The address of the machine of rank 0 (default "127.0.0.1").
        node_rank (int): This machine's rank among `num_nodes` (default 0).
        num_nodes (int): How many machines run the function (default 1).
        rdzv_backend (str): The rendezvous: "static" (default) or "c10d".
        rdzv_endpoint (str): The c10d rendezvous's `host:port`.
        rdzv_conf (dict | None): Extra options of the rendezvous.
        rdzv_id (str): The job's id for the rendezvous (default "none").
        max_restarts (int): How many times the workers are restarted after a failure (default 0).
        monitor_interval (float): Seconds between the agent's checks of the workers (default 0.1).
        log_line_prefix_template (str | None): A prefix for each worker's output lines, e.g.
            "[${rank}]: ".

    Raises:
        ValueError: A count out of bounds (processes, machines, ranks, port), a bad precision, or a
            CUDA context already started in this process (the workers could not use the GPUs).
        TypeError: `function` is not callable.
        RuntimeError: A worker failed (a `WorkerProcessesFailed`); the message names the rank that
            failed first and its exception.

    Example:
        >>> import os
        >>> from cadence import notebook_launcher
        >>> def train(folder):
        ...     from cadence import Accelerator
        ...     accelerator = Accelerator(cpu=True)
        ...     with open(os.path.join(folder, f"rank{accelerator.process_index}"), "w") as f:
        ...         f.write(str(accelerator.num_processes))
        >>> os.makedirs("ranks")
        >>> import socket
        >>> with socket.socket() as free:  # any free port, in case 29500 is taken
        ...     free.bind(("127.0.0.1", 0))
        ...     port = str(free.getsockname()[1])
        >>> notebook_launcher(train, ("ranks",), num_processes=2, use_port=port)
        >>> sorted(os.listdir("ranks"))
        ['rank0', 'rank1']
    """

    mixed_precision = resolve_mixed_precision(mixed_precision, {})
    if num_processes is not None and (not isinstance(num_processes, int) or num_processes < 1):
        raise ValueError(f"num_processes must be a positive integer, got {num_processes!r}.")
    if not callable(function):
        raise TypeError(
            f"notebook_launcher needs a function to run, got {type(function).__name__}."
        )
    if xla_requested(False, {}):  # PJRT_DEVICE set or a TPU here: torch_xla's launcher
        _launch_on_xla(function, args, num_processes, mixed_precision)
        return
    if num_processes is None or (num_processes == 1 and num_nodes == 1):
        with _environment(
            **{LAUNCH_CONFIG_ENV: encode_launch_config({"mixed_precision": mixed_precision})}
        ):
            function(*args)
        return
    # First the arguments themselves, then the notebook's own state (an Accelerator or a CUDA context
    # the user must get rid of), then whether this machine has the GPUs asked for.
    counts = (num_processes, num_nodes, node_rank, use_port, max_restarts, monitor_interval)
    _check_counts(*counts, cpu_only=True)
    _refuse_initialised_cuda()
    _check_counts(*counts)
    # Counted through NVML: a CUDA context here would make every forked worker fail.
    gpus = cuda_device_count()
    backend = "nccl" if gpus > 0 else "gloo"
    check_precision_supported(
        mixed_precision,
        device_type="cuda" if gpus > 0 else "cpu",
        capability=cuda_compute_capability() if mixed_precision == "fp8" and gpus else None,
    )
    settings = {
        "num_processes": num_processes * num_nodes,
        "num_machines": num_nodes,
        "mixed_precision": mixed_precision,
        "backend": backend,
    }
    agent = _AgentOptions(
        master_addr, use_port, node_rank, num_nodes, rdzv_backend, rdzv_endpoint, rdzv_conf,
        rdzv_id, max_restarts, monitor_interval, log_line_prefix_template,
    )  # fmt: skip
    _launch_with_elastic_agent(
        function, args, num_processes=num_processes, settings=settings, agent=agent
    )


def debug_launcher(
    function: Callable[..., Any], args: tuple[Any, ...] = (), num_processes: int = 2
) -> None:
    """Run `function(*args)` on `num_processes` CPU processes (gloo), to try distributed code on any machine.

    Args:
        function (Callable): The function; it runs in every process.
        args (tuple): The arguments passed to `function` (default none).
        num_processes (int): How many processes (default 2). Below 1, or more than the machine allows,
            raises ValueError.

    Raises:
        ValueError: A bad `num_processes`.
        RuntimeError: A worker failed (a `WorkerProcessesFailed`); the message names the rank that
            failed first and its exception.
    """
    if not isinstance(num_processes, int) or num_processes < 1:
        raise ValueError(f"num_processes must be a positive integer, got {num_processes!r}.")
    _check_counts(num_processes, cpu_only=True)
    settings = {
        "num_processes": num_processes,
        "use_cpu": True,
        "backend": "gloo",
        "mixed_precision": "no",
    }
    agent = _AgentOptions(master_addr="127.0.0.1", port=_free_port())
    _launch_with_elastic_agent(
        function, args, num_processes=num_processes, settings=settings, agent=agent
    )


def test_launch() -> None:
    """Check that this process can build its `PartialState` (what a launched worker does first)."""

    PartialState()
