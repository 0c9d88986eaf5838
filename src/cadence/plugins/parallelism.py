"""ParallelismConfig: how the processes are arranged in a device mesh (data replicate / shard, tensor,
context and sequence parallel sizes), and the small per-dimension settings classes."""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import Any

from ..core.enums import DistributedType
from ..core.settings import plugin_env_text, resolve_flag
from .pipeline import PipelineParallelConfig

# Outermost dimension first: pipeline stages (as torchtitan orders them: the stages' point-to-point
# traffic is the lightest), replicas, shards, then the dimensions whose ranks see the same batch.
MESH_ORDER = ("pp", "dp_replicate", "dp_shard", "cp", "sp", "tp")


@dataclass
class TorchTensorParallelPlugin:
    """Deprecated in Accelerate: use `ParallelismConfig(tp_size=...)`.

    Args:
        tp_size (int): The tensor-parallel degree (default 1).
        torch_device_mesh (torch.distributed.device_mesh.DeviceMesh | None): A mesh to use.
    """

    tp_size: int = 1
    torch_device_mesh: Any = None


@dataclass
class TorchTensorParallelConfig:
    """Tensor-parallel options of a `ParallelismConfig`.

    Args:
        enable_async_tp (bool): Asynchronous tensor parallelism; not supported by Cadence (it needs
            fused kernels), so True only warns (default False).
        tp_plan (dict | Callable | None): Cadence only: how to split a plain model. A dict from module
            name (with `*` wildcards) to "colwise", "rowwise", "colwise_rep", "rowwise_rep",
            "sequence_parallel" or a torch `ParallelStyle`, or a callable `plan(model, tp_mesh)`. None
            uses the model's own `tp_plan` (transformers models have one).
    """

    enable_async_tp: bool = False
    tp_plan: Any = None

    def __post_init__(self) -> None:
        if self.enable_async_tp:
            warnings.warn(
                "Async tensor parallelism is not supported; ignoring enable_async_tp.", stacklevel=3
            )


@dataclass
class TorchContextParallelConfig:
    """Context-parallel options of a `ParallelismConfig`: how ring attention exchanges key/value shards.

    Args:
        cp_comm_strategy (str | None): "allgather" (default) or "alltoall"; None reads
            `PARALLELISM_CONFIG_CP_COMM_STRATEGY`. Another value raises ValueError.
    """

    cp_comm_strategy: str | None = None

    def __post_init__(self) -> None:
        if self.cp_comm_strategy is None:
            self.cp_comm_strategy = plugin_env_text(
                "PARALLELISM_CONFIG_CP_COMM_STRATEGY", "allgather"
            )
        if self.cp_comm_strategy not in ("allgather", "alltoall"):
            raise ValueError(
                f"Invalid cp_comm_strategy: {self.cp_comm_strategy}. Use 'allgather' or 'alltoall' "
                "(argument or PARALLELISM_CONFIG_CP_COMM_STRATEGY)."
            )


@dataclass
class DeepSpeedSequenceParallelConfig:
    """Sequence-parallel (DeepSpeed Ulysses) options of a `ParallelismConfig` (not supported by Cadence yet).

    Args:
        sp_seq_length (int | None): The fixed sequence length, required when it is not variable.
        sp_seq_length_is_variable (bool | None): Whether sequences vary in length (None reads
            `PARALLELISM_CONFIG_SP_SEQ_LENGTH_IS_VARIABLE`, default True).
        sp_attn_implementation (str | None): The attention implementation to use.
    """

    sp_seq_length: int | None = None
    sp_seq_length_is_variable: bool | None = None
    sp_attn_implementation: str | None = None

    def __post_init__(self) -> None:
        if self.sp_seq_length_is_variable is None:
            raw = plugin_env_text("PARALLELISM_CONFIG_SP_SEQ_LENGTH_IS_VARIABLE", "true")
            self.sp_seq_length_is_variable = raw.lower() == "true"
        if not self.sp_seq_length_is_variable and self.sp_seq_length is None:
            raw = plugin_env_text("PARALLELISM_CONFIG_SP_SEQ_LENGTH")
            if raw is None:
                raise ValueError(
                    "sp_seq_length_is_variable=False needs sp_seq_length (or the environment variable "
                    "PARALLELISM_CONFIG_SP_SEQ_LENGTH)."
                )
            self.sp_seq_length = None if raw == "None" else int(raw)
        if self.sp_attn_implementation is None:
            self.sp_attn_implementation = plugin_env_text(
                "PARALLELISM_CONFIG_SP_ATTN_IMPLEMENTATION"
            )
        _check_sp_attn_implementation(self.sp_attn_implementation)


# Attention kernels that Ulysses sequence parallelism can run: the built-in flash / sdpa ones, or a
# flash-attention kernel hosted on the Hub ("org/flash-attn..."), which DeepSpeed checks itself later.
SP_ATTN_BUILTIN = ("flash_attention_2", "flash_attention_3", "sdpa")


def _check_sp_attn_implementation(name: str | None) -> None:
    if name is None or name in SP_ATTN_BUILTIN:
        return
    if name in ("eager", "flex_attention"):
        raise ValueError(
            f"Invalid sp_attn_implementation: {name}. Sequence parallelism cannot use 'eager' or "
            f"'flex_attention' attention; choose one of {list(SP_ATTN_BUILTIN)}."
        )
    if "/" not in name or "flash-attn" not in name:
        raise ValueError(
            f"Invalid sp_attn_implementation: {name}. Choose one of {list(SP_ATTN_BUILTIN)} or a "
            "flash-attention kernel from the Hub such as 'kernels-community/flash-attn2'."
        )


def _env_size(name: str) -> int:
    return int(plugin_env_text(f"PARALLELISM_CONFIG_{name.upper()}", "1"))


@dataclass
class ParallelismConfig:
    """The sizes of the parallel dimensions; their product must be the number of processes.

    The Accelerator builds a `DeviceMesh` from it (`accelerator.torch_device_mesh`) and shards the model
    along it. `dp_shard_size > 1` shards parameters with FSDP2; with `dp_replicate_size > 1` as well,
    that is hybrid sharding (HSDP: sharded within a group, replicated across groups). `tp_size > 1`
    splits layers by a tensor-parallel plan; every rank of one tensor-parallel group reads the same batch.
    `cp_size > 1` splits the sequence dimension (context parallelism, with FSDP2). `pp_size > 1` (Cadence
    only) splits the model's layers into pipeline stages, `pp_handler` says how. Sizes left None come
    from `PARALLELISM_CONFIG_<NAME>` variables (set by `cadence launch`), else 1. With every size 1 on
    several processes, `dp_replicate_size` becomes the number of processes (plain DDP).

    Args:
        dp_replicate_size (int | None): Replicas of the model (data parallel, DDP-like).
        dp_shard_size (int | None): Processes one copy of the model is sharded over (FSDP2).
        tp_size (int | None): Tensor-parallel degree.
        cp_size (int | None): Context-parallel degree (sequence split over processes).
        cp_backend (str | None): Only "torch" (default); another value raises ValueError.
        sp_size (int | None): Sequence-parallel degree (DeepSpeed Ulysses; not supported by Cadence:
            a value above 1 raises NotImplementedError when the Accelerator starts).
        sp_backend (str | None): Only "deepspeed" (default).
        tp_handler (TorchTensorParallelConfig | None): Tensor-parallel options (the plan of a plain
            model); created with defaults when `tp_size > 1`.
        cp_handler (TorchContextParallelConfig | None): Context-parallel options (how key/value shards
            are exchanged); created with defaults when `cp_size > 1`.
        sp_handler (DeepSpeedSequenceParallelConfig | None): Sequence-parallel options.
        pp_size (int | None): Pipeline-parallel degree (Cadence only): processes the model's stages
            are spread over, outermost in the mesh. Above 1 it composes with dp_replicate, dp_shard
            and tp; with cp or sp it is refused.
        pp_handler (PipelineParallelConfig | None): Pipeline options (schedule, micro-batches,
            stages per process, split points, loss); created with defaults when `pp_size > 1`.

    Raises:
        ValueError: A size below 1 or not an integer; both `cp_size` and `sp_size` above 1; tensor or
            context parallelism with pure replication (`dp_replicate_size > 1`, `dp_shard_size == 1`);
            `pp_size > 1` with cp or sp;
            and, when the Accelerator starts, sizes whose product is not the number of processes.

    Example:
        >>> from cadence import ParallelismConfig
        >>> config = ParallelismConfig(dp_replicate_size=2, dp_shard_size=4)  # for 8 processes
        >>> config.total_size, config.fsdp_dim_names
        (8, ['dp_replicate', 'dp_shard_cp'])
    """

    dp_replicate_size: int | None = None
    dp_shard_size: int | None = None
    tp_size: int | None = None
    cp_size: int | None = None
    cp_backend: str | None = None
    sp_size: int | None = None
    sp_backend: str | None = None
    tp_handler: TorchTensorParallelConfig | None = None
    cp_handler: TorchContextParallelConfig | None = None
    sp_handler: DeepSpeedSequenceParallelConfig | None = None
    pp_size: int | None = None
    pp_handler: PipelineParallelConfig | None = None
    device_mesh: Any = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        for name in ("dp_replicate", "dp_shard", "tp", "cp", "sp", "pp"):
            attr = f"{name}_size"
            if getattr(self, attr) is None:
                setattr(self, attr, _env_size(attr))
            value = getattr(self, attr)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{attr} must be an integer of at least 1, got {value!r}.")
        if self.cp_backend is None:
            self.cp_backend = plugin_env_text("PARALLELISM_CONFIG_CP_BACKEND", "torch")
        if self.sp_backend is None:
            self.sp_backend = plugin_env_text("PARALLELISM_CONFIG_SP_BACKEND", "deepspeed")
        if self.cp_backend != "torch":
            raise ValueError(f"cp_backend must be 'torch', got {self.cp_backend!r}.")
        if self.sp_backend != "deepspeed":
            raise ValueError(f"sp_backend must be 'deepspeed', got {self.sp_backend!r}.")
        if self.tp_size > 1 and self.tp_handler is None:
            self.tp_handler = TorchTensorParallelConfig()
        if self.cp_size > 1:
            if self.cp_handler is None:
                self.cp_handler = TorchContextParallelConfig()
            elif not isinstance(self.cp_handler, TorchContextParallelConfig):
                raise ValueError(
                    f"cp_backend='torch' needs cp_handler=TorchContextParallelConfig(...), got "
                    f"{type(self.cp_handler).__name__}."
                )
        if self.sp_size > 1 and self.sp_handler is None:
            self.sp_handler = DeepSpeedSequenceParallelConfig()
        if self.cp_size > 1 and self.sp_size > 1:
            raise ValueError(
                f"Context parallelism and sequence parallelism cannot be combined (cp_size={self.cp_size}, "
                f"sp_size={self.sp_size}): set one of them to 1."
            )
        if (
            (self.tp_size > 1 or self.cp_size > 1)
            and self.dp_replicate_size > 1
            and self.dp_shard_size == 1
        ):
            raise ValueError(
                "Tensor/context parallelism cannot be combined with pure replication "
                "(dp_replicate_size > 1, dp_shard_size == 1): use dp_shard_size > 1 for FSDP + TP/CP "
                "(or HSDP + TP/CP with both > 1)."
            )
        self._check_pipeline()

    def _check_pipeline(self) -> None:
        """pp_size > 1: the handler's type and what the pipeline cannot be combined with (yet)."""
        if self.pp_size == 1:
            return
        if self.pp_handler is None:
            self.pp_handler = PipelineParallelConfig()
        elif not isinstance(self.pp_handler, PipelineParallelConfig):
            raise ValueError(
                f"pp_size > 1 needs pp_handler=PipelineParallelConfig(...), got "
                f"{type(self.pp_handler).__name__}."
            )
        for name, what in (("cp", "context"), ("sp", "sequence")):
            size = getattr(self, f"{name}_size")
            if size > 1:
                # Refused rather than run approximately: Cadence has no test of these meshes yet.
                raise ValueError(
                    f"Pipeline parallelism (pp_size={self.pp_size}) cannot be combined with {what} "
                    f"parallelism ({name}_size={size}) in Cadence yet: set one of them to 1 "
                    "(pp composes with dp_replicate_size, dp_shard_size and tp_size)."
                )
        self.pp_handler.check_against(self.pp_size)

    # -- sizes and dimension names ------------------------------------------------------------------
    @property
    def _sizes(self) -> dict[str, int]:
        return {
            "dp_replicate": self.dp_replicate_size,
            "dp_shard": self.dp_shard_size,
            "tp": self.tp_size,
            "cp": self.cp_size,
            "sp": self.sp_size,
            "pp": self.pp_size,
        }

    def _set_size(self, parallelism: str, size: int) -> None:
        if parallelism not in self._sizes:
            raise ValueError(f"Unknown parallel dimension {parallelism!r}.")
        setattr(self, f"{parallelism}_size", size)

    @property
    def total_size(self) -> int:
        """The product of all dimension sizes (must equal the number of processes)."""
        return (
            self.pp_size
            * self.dp_replicate_size
            * self.dp_shard_size
            * self.tp_size
            * self.cp_size
            * self.sp_size
        )

    @property
    def non_data_parallel_size(self) -> int:
        """Ranks that see the same batch: tp x cp x sp (x pp: every stage reads the batch) sizes."""
        return self.tp_size * self.cp_size * self.sp_size * self.pp_size

    @property
    def data_parallel_size(self) -> int:
        """Number of data-parallel ranks: dp_replicate x dp_shard sizes."""
        return self.dp_replicate_size * self.dp_shard_size

    @property
    def dp_replicate_enabled(self) -> bool:
        """Whether the model is replicated over more than one group."""
        return self.dp_replicate_size > 1

    @property
    def dp_shard_enabled(self) -> bool:
        """Whether the model is sharded over more than one rank."""
        return self.dp_shard_size > 1

    @property
    def tp_enabled(self) -> bool:
        """Whether tensor parallelism is on (tp_size > 1)."""
        return self.tp_size > 1

    @property
    def cp_enabled(self) -> bool:
        """Whether context parallelism is on (cp_size > 1)."""
        return self.cp_size > 1

    @property
    def sp_enabled(self) -> bool:
        """Whether sequence parallelism is on (sp_size > 1)."""
        return self.sp_size > 1

    @property
    def pp_enabled(self) -> bool:
        """Whether pipeline parallelism is on (pp_size > 1)."""
        return self.pp_size > 1

    @property
    def dp_dim_names(self) -> list[str]:
        """The active data-parallel mesh dimensions (dp_replicate, dp_shard)."""
        return [n for n in ("dp_replicate", "dp_shard") if self._sizes[n] > 1]

    @property
    def non_dp_dim_names(self) -> list[str]:
        """The active non-data-parallel mesh dimensions (tp, cp, sp)."""
        return [n for n in ("tp", "cp", "sp") if self._sizes[n] > 1]

    @property
    def dp_shard_cp_dim_names(self) -> list[str]:
        """The active dimensions among dp_shard and cp (flattened into `dp_shard_cp`)."""
        return [n for n in ("dp_shard", "cp") if self._sizes[n] > 1]

    @property
    def dp_cp_dim_names(self) -> list[str]:
        """The active dimensions among dp_replicate, dp_shard and cp (flattened into `dp_cp`)."""
        return [n for n in ("dp_replicate", "dp_shard", "cp") if self._sizes[n] > 1]

    @property
    def fsdp_dim_names(self) -> list[str]:
        """The mesh dimensions FSDP shards over: `dp_shard_cp`, after `dp_replicate` if on."""
        return (["dp_replicate"] if self.dp_replicate_enabled else []) + ["dp_shard_cp"]

    @property
    def active_mesh_dims(self) -> list[str]:
        """All active mesh dimensions: pp (when on), the data-parallel ones, then the others."""
        return (["pp"] if self.pp_enabled else []) + self.dp_dim_names + self.non_dp_dim_names

    # -- the device mesh ----------------------------------------------------------------------------
    def _get_mesh(self) -> tuple[tuple[str, ...], tuple[int, ...]]:
        names = sorted(self.active_mesh_dims, key=MESH_ORDER.index)
        return tuple(names), tuple(self._sizes[n] for n in names)

    def build_device_mesh(self, device_type: str) -> Any:
        """A new `DeviceMesh` of the dimensions whose size is above 1, with the flattened `dp`, `dp_shard_cp` and `dp_cp` dimensions.

        Args:
            device_type (str): "cuda", "cpu", ...

        Returns:
            torch.distributed.device_mesh.DeviceMesh | None: The mesh; None when no dimension is above 1 or
            with sequence parallelism (DeepSpeed builds its own groups).
        """
        if self.sp_enabled:
            return None  # DeepSpeed builds its own sequence parallel groups
        names, shape = self._get_mesh()
        if not names:
            return None
        from torch.distributed.device_mesh import init_device_mesh

        mesh = init_device_mesh(device_type, shape, mesh_dim_names=names)
        for flat_name, dims in (
            ("dp", self.dp_dim_names),
            ("dp_shard_cp", self.dp_shard_cp_dim_names),
            ("dp_cp", self.dp_cp_dim_names),
        ):
            if dims:
                # Indexed with the list itself, as the reference does (a DeviceMesh accepts it).
                mesh[dims]._flatten(flat_name)
        return mesh

    def get_device_mesh(self, device_type: str | None = None) -> Any:
        """The device mesh, built for `device_type` on the first call; later calls return the same one.

        Args:
            device_type (str | None): "cuda", "cpu", ...; required on the first call.

        Returns:
            torch.distributed.device_mesh.DeviceMesh | None: The mesh.

        Raises:
            ValueError: No `device_type` on the first call, or another one than the mesh was built for.
        """
        if self.device_mesh is None:
            if device_type is None:
                raise ValueError(
                    "get_device_mesh() needs a device_type (e.g. 'cuda' or 'cpu') the first time."
                )
            self.device_mesh = self.build_device_mesh(device_type)
        elif device_type is not None and self.device_mesh.device_type != device_type:
            raise ValueError(
                f"The device mesh was built for {self.device_mesh.device_type!r}, not {device_type!r}."
            )
        return self.device_mesh

    def validate(
        self,
        num_processes: int,
        distributed_type: DistributedType,
        is_fsdp2: bool,
        is_main_process: bool,
    ) -> None:
        """Check the sizes against the job; with every size 1 on several processes, set `dp_replicate_size`.

        The Accelerator calls it when it starts.

        Args:
            num_processes (int): The number of processes.
            distributed_type (DistributedType): How they train together.
            is_fsdp2 (bool): Whether FSDP2 shards the model.
            is_main_process (bool): Whether this is rank 0 (only it warns).

        Raises:
            ValueError: The product of the sizes is not `num_processes`; FSDP without a dimension to shard
                over; FSDP version 1.
            NotImplementedError: `sp_size > 1`.
        """
        if num_processes == 1 and self.total_size == 1:
            return
        if self.total_size == 1:
            self._set_size("dp_replicate", num_processes)
        if self.total_size != num_processes:
            raise ValueError(
                f"ParallelismConfig total_size ({self.total_size} = pp {self.pp_size} x "
                f"dp_replicate {self.dp_replicate_size} x "
                f"dp_shard {self.dp_shard_size} x tp {self.tp_size} x cp {self.cp_size} x sp {self.sp_size}) does "
                f"not match the number of processes ({num_processes}). Adjust the sizes so their product is "
                f"{num_processes}."
            )
        if is_fsdp2 and not (self.dp_shard_enabled or self.cp_enabled):
            raise ValueError(
                "FSDP is enabled but the ParallelismConfig has no dimension to shard over (dp_shard_size "
                "and cp_size are both 1): set dp_shard_size > 1, or launch without FSDP."
            )
        if distributed_type == DistributedType.FSDP and not is_fsdp2:
            raise ValueError(
                "ParallelismConfig needs FSDP version 2 (fsdp_version=2), DDP or DeepSpeed; FSDP1 "
                "cannot use a device mesh here."
            )
        for name, size in self._sizes.items():
            if size == 1 and getattr(self, f"{name}_handler", None) is not None:
                if is_main_process:
                    warnings.warn(
                        f"ParallelismConfig.{name}_handler is set but {name}_size is 1: it is ignored.",
                        UserWarning,
                        stacklevel=3,
                    )

    def __repr__(self) -> str:
        return (
            f"ParallelismConfig(dp_replicate_size={self.dp_replicate_size}, "
            f"dp_shard_size={self.dp_shard_size}, tp_size={self.tp_size}, cp_size={self.cp_size}, "
            f"cp_backend={self.cp_backend!r}, sp_size={self.sp_size}, sp_backend={self.sp_backend!r}, "
            f"total_size={self.total_size}, tp_handler={self.tp_handler}, cp_handler={self.cp_handler}"
            + (f", pp_size={self.pp_size}, pp_handler={self.pp_handler}" if self.pp_enabled else "")
            + ")"
        )

    def to_json(self) -> dict[str, Any]:
        """The sizes, backends and handlers as a dict that `json.dumps` accepts.

        Returns:
            dict[str, Any]: Field names to values.
        """
        result: dict[str, Any] = {}
        for name in (
            "dp_replicate_size", "dp_shard_size", "tp_size", "cp_size", "cp_backend", "sp_size",
            "sp_backend", "tp_handler", "cp_handler", "sp_handler", "pp_size", "pp_handler",
        ):  # fmt: skip
            value = getattr(self, name)
            if isinstance(value, PipelineParallelConfig):
                result[name] = value.to_json()
            else:
                result[name] = dict(vars(value)) if hasattr(value, "__dict__") else value
        return result


def parallelism_from_env() -> ParallelismConfig | None:
    """A ParallelismConfig from PARALLELISM_CONFIG_* when ACCELERATE_USE_PARALLELISM_CONFIG is true."""
    if resolve_flag("use_parallelism_config", launch={}).value:
        return ParallelismConfig()
    return None


def data_parallel_coordinates(
    config: ParallelismConfig | None, device: Any, process_index: int, num_processes: int
) -> tuple[int, int]:
    """(index, count) of this process among the data-parallel replicas of `config`'s mesh: ranks that
    share a tensor/context-parallel group read the same batches."""
    if config is None or config.non_data_parallel_size <= 1:
        return process_index, num_processes
    if config.sp_enabled and config.tp_size * config.cp_size == 1:
        # Ulysses' loader adapter gathers a different sample from each rank of an sp group.
        return process_index, num_processes
    if not config.dp_dim_names:
        return 0, 1
    dp = config.get_device_mesh(device.type)["dp"]
    return dp.get_local_rank(), dp.size()


def mesh_data_parallel_coordinates(
    mesh: Any, process_index: int, num_processes: int, deepspeed: bool = False
) -> tuple[int, int]:
    """(index, count) among the data-parallel replicas of a device mesh given to prepare_data_loader."""
    names = mesh.mesh_dim_names or ()

    def size(name: str) -> int:
        return mesh[name].size() if name in names else 1

    if deepspeed:
        return process_index // size("tp"), num_processes // size("tp")
    return (
        process_index // (size("tp") * size("cp")),
        size("dp_shard") * size("dp_replicate"),
    )
