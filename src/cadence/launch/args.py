"""The flags of `cadence launch`: the names and meanings of Accelerate's launcher, plus `--dry_run`.

Every flag accepts `--with_underscores` and `--with-hyphens`. Flags the user did not type are absent
from the parsed namespace (argparse.SUPPRESS), so the planner can tell a typed value from a default.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from ..precision.choice import MIXED_PRECISION_CHOICES
from .fault_tolerance_flags import add_fault_tolerance_flags

DYNAMO_BACKENDS = (
    "no",
    "eager",
    "aot_eager",
    "inductor",
    "aot_ts_nvfuser",
    "nvprims_nvfuser",
    "cudagraphs",
    "ofi",
    "fx2trt",
    "onnxrt",
    "tensorrt",
    "aot_torchxla_trace_once",
    "torhchxla_trace_once",
    "torchxla_trace_once",
    "ipex",
    "tvm",
    "hpu_backend",
)
DYNAMO_MODES = ("default", "reduce-overhead", "max-autotune")
RDZV_BACKENDS = ("static", "c10d", "etcd", "etcd-v2")
FSDP_SHARDING_STRATEGIES = (
    "FULL_SHARD",
    "SHARD_GRAD_OP",
    "NO_SHARD",
    "HYBRID_SHARD",
    "HYBRID_SHARD_ZERO2",
)
FSDP_AUTO_WRAP_POLICIES = ("TRANSFORMER_BASED_WRAP", "SIZE_BASED_WRAP", "NO_WRAP")
FSDP_BACKWARD_PREFETCH = ("BACKWARD_PRE", "BACKWARD_POST", "NO_PREFETCH")
FSDP_STATE_DICT_TYPES = ("FULL_STATE_DICT", "LOCAL_STATE_DICT", "SHARDED_STATE_DICT")
DEEPSPEED_OFFLOAD_DEVICES = ("none", "cpu", "nvme")
DEEPSPEED_MULTINODE_LAUNCHERS = (
    "pdsh",
    "standard",
    "openmpi",
    "mvapich",
    "mpich",
    "nossh",
    "slurm",
)

# Reference flags Cadence recognises but cannot honour: using one is a clear error, not "unknown flag".
# A name ending in "_" covers every flag starting with it.
UNSUPPORTED_FLAG_PREFIXES = {
    "--use_megatron_lm": "Megatron-LM is not supported by Cadence",
    "--megatron_lm_": "Megatron-LM is not supported by Cadence",
    "--fp8_": "FP8 recipe flags are not supported by Cadence yet",
    "--aws_": "Amazon SageMaker launching is not supported by Cadence",
    "--mpirun_hostfile": "launching through mpirun is not supported; start `mpirun python script.py` yourself",
    "--use_parallelism_config": "the N-d parallelism config is not supported by Cadence yet",
    "--parallelism_config_": "of the N-d parallelism config flags, Cadence takes only "
    "--parallelism_config_pp_size and --parallelism_config_pp_schedule yet (set the other sizes in "
    "ParallelismConfig(...))",
}


def str_to_bool(value: str) -> bool:
    """Parse a true/false command-line value (1/0, yes/no, on/off, ...); raise otherwise."""
    lowered = str(value).strip().lower()
    if lowered in ("1", "true", "yes", "y", "on"):
        return True
    if lowered in ("0", "false", "no", "n", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {value!r}")


def _lower(value: str) -> str:
    return value.lower()


def _upper(value: str) -> str:
    return value.upper()


class _Adder:
    """Adds each option under both spellings and remembers every accepted option string."""

    def __init__(self) -> None:
        self.option_strings: list[str] = []

    def __call__(self, group: Any, *names: str, **kwargs: Any) -> None:
        spelled = []
        for name in names:
            spelled.append(name)
            if name.startswith("--") and "_" in name[2:]:
                spelled.append("--" + name[2:].replace("_", "-"))
        self.option_strings.extend(spelled)
        group.add_argument(*spelled, **kwargs)


def build_launch_parser(
    make_parser: Callable[..., argparse.ArgumentParser] | None = None,
) -> tuple[argparse.ArgumentParser, list[str]]:
    """The `cadence launch` parser and the list of option strings it accepts (for suggestions)."""
    description = (
        "Launch a Python script on one or many processes and machines. Flags accept hyphens or "
        "underscores (--num-processes or --num_processes). Values come from, in order: the command line, "
        "CADENCE_<FLAG> environment variables (e.g. CADENCE_NUM_PROCESSES), the config file, defaults."
    )
    options: dict[str, Any] = {
        "description": description,
        "usage": "cadence launch [options] script.py [script arguments]\n       cadence launch [options] -m module [module arguments]",
        "allow_abbrev": False,
        "argument_default": argparse.SUPPRESS,
        "add_help": True,
    }
    parser = (
        make_parser(**options)
        if make_parser
        else argparse.ArgumentParser("cadence launch", **options)
    )
    add = _Adder()

    add(
        parser,
        "--config_file",
        help="The config file to read defaults from (default: the one `cadence config` wrote).",
    )
    add(parser, "--quiet", "-q", action="store_true", help="Do not print the launch banner.")
    add(
        parser,
        "--dry_run",
        action="store_true",
        help="Print the resolved plan and the exact worker command, and start nothing.",
    )

    add(parser, "--as_accelerate", action="store_true",
        help="Set CADENCE_AS_ACCELERATE=1 for every worker: `import accelerate` (transformers' "
        "Trainer, TRL, peft, diffusers) gives Cadence.")  # fmt: skip

    hardware = parser.add_argument_group("Hardware selection")
    add(hardware, "--cpu", action="store_true", help="Run on CPU (gloo), even if GPUs are present.")
    add(hardware, "--multi_gpu", action="store_true", help="Run one process per GPU (NCCL).")

    resources = parser.add_argument_group("Resource selection")
    add(resources, "--mixed_precision", type=_lower, choices=MIXED_PRECISION_CHOICES,
        help="Mixed precision mode (default: no).")  # fmt: skip
    add(resources, "--num_processes", type=int,
        help="Total number of processes across all machines (default: GPUs here, else 1).")  # fmt: skip
    add(resources, "--num_machines", type=int, help="Number of machines (default: 1).")
    add(resources, "--nnodes", metavar="N|MIN:MAX",
        help="torchrun's node count: N, or MIN:MAX for an elastic job that goes on when nodes leave "
        "or join (c10d rendezvous; see --max_restarts).")  # fmt: skip
    add(resources, "--nproc_per_node", type=int,
        help="torchrun's processes per node (the alternative to the total --num_processes).")  # fmt: skip
    add(resources, "--oversubscribe", action="store_true",
        help="Allow more than 8 CPU processes per core on a machine (refused otherwise, as a likely typo).")  # fmt: skip
    add(resources, "--num_cpu_threads_per_process", type=int,
        help="Threads per process; sets OMP_NUM_THREADS (default: cores / local processes on CPU).")  # fmt: skip
    add(
        resources,
        "--enable_cpu_affinity",
        action="store_true",
        help="Pin processes to CPU cores near their GPU.",
    )
    add(
        resources,
        "--dynamo_backend",
        type=_lower,
        choices=DYNAMO_BACKENDS,
        metavar="BACKEND",
        help="torch.compile backend: no (default), eager, aot_eager, inductor, cudagraphs, ...",
    )
    add(resources, "--dynamo_mode", type=_lower, choices=DYNAMO_MODES, help="torch.compile mode.")
    add(
        resources,
        "--dynamo_use_fullgraph",
        action="store_true",
        help="torch.compile with fullgraph=True.",
    )
    add(
        resources,
        "--dynamo_use_dynamic",
        action="store_true",
        help="torch.compile with dynamic=True.",
    )
    add(resources, "--dynamo_use_regional_compilation", action="store_true",
        help="Compile repeated blocks once.")  # fmt: skip
    add(resources, "--gradient_accumulation_steps", type=int, help="Gradient accumulation steps.")

    add(hardware, "--tpu", action="store_true",
        help="Run the script's main function on this host's XLA devices (TPU) through torch_xla.")  # fmt: skip
    tpu = parser.add_argument_group("TPU (with --tpu; multi-host pods are not launched by Cadence)")
    add(tpu, "--tpu_cluster", action="store_true", dest="tpu_use_cluster",
        help="Launch on a TPU pod (not supported: run `cadence launch --tpu` on every host).")  # fmt: skip
    add(tpu, "--no_tpu_cluster", action="store_false", dest="tpu_use_cluster",
        help="Launch on this TPU VM only (the default).")  # fmt: skip
    add(tpu, "--tpu_use_sudo", action="store_true", help="Pod launch with sudo (not supported).")
    add(tpu, "--vm", action="append", help="Pod host names (not supported).")
    add(tpu, "--env", action="append", help="Pod environment variables (not supported).")

    paradigm = parser.add_argument_group("Training paradigm")
    add(paradigm, "--use_deepspeed", action="store_true", help="Train with DeepSpeed.")
    add(paradigm, "--use_fsdp", action="store_true", help="Train with Fully Sharded Data Parallel.")

    dist = parser.add_argument_group("Distributed")
    add(dist, "--gpu_ids", help="Comma-separated GPU ids to use on this machine (default: all).")
    add(dist, "--same_network", action="store_true", help="All machines share one local network.")
    add(
        dist,
        "--machine_rank",
        type=int,
        help="Rank of this machine, 0 for the main one (default: 0).",
    )
    add(dist, "--main_process_ip", help="IP address of the machine of rank 0.")
    add(dist, "--main_process_port", type=int,
        help="Port on the main machine (default: a free port on one machine, 29500 on several).")  # fmt: skip
    add(
        dist,
        "--tee",
        "-t",
        help="Tee worker streams to log files and the console: 0 none, 1 stdout, 2 stderr, 3 both.",
    )
    add(dist, "--log_dir", help="Folder for worker log and error files.")
    add(dist, "--role", help="User-defined role of the workers (default: default).")
    add(dist, "--rdzv_backend", type=_lower, help="Rendezvous: static (default) or c10d.")
    add(dist, "--rdzv_conf", help="Extra rendezvous settings: key1=value1,key2=value2.")
    add(dist, "--rdzv_endpoint", metavar="HOST:PORT",
        help="torchrun's rendezvous address (sets --main_process_ip and --main_process_port).")  # fmt: skip
    add(
        dist,
        "--max_restarts",
        type=int,
        help="Restarts of the worker group before failing (default: 0).",
    )
    add(
        dist,
        "--monitor_interval",
        type=float,
        help="Seconds between worker health checks (default: 0.1).",
    )
    add_fault_tolerance_flags(parser, add)
    add(
        parser,
        "--module",
        "-m",
        action="store_true",
        help="Run the target as a module, like `python -m`.",
    )
    add(
        parser,
        "--no_python",
        action="store_true",
        help="Run the target as an executable, not with python.",
    )
    add(
        parser,
        "--main_training_function",
        help="Name of the script's main function (default: main).",
    )
    add(
        parser,
        "--downcast_bf16",
        action="store_true",
        help="With bf16 on TPU: keep float64 as float32.",
    )
    add(
        parser,
        "--debug",
        action="store_true",
        help="Check collectives for mismatches; print full failure details.",
    )

    ds = parser.add_argument_group("DeepSpeed (with --use_deepspeed)")
    add(ds, "--deepspeed_config_file", help="DeepSpeed JSON config file.")
    add(ds, "--zero_stage", type=int, help="ZeRO stage 0-3 (default: 2).")
    add(ds, "--offload_optimizer_device", type=_lower, help="none, cpu or nvme (default: none).")
    add(ds, "--offload_param_device", type=_lower, help="none, cpu or nvme (default: none).")
    add(ds, "--offload_optimizer_nvme_path", help="NVMe path for optimizer offload.")
    add(ds, "--offload_param_nvme_path", help="NVMe path for parameter offload.")
    add(ds, "--gradient_clipping", type=float, help="Gradient clipping value (default: 1.0).")
    add(
        ds,
        "--zero3_init_flag",
        type=str_to_bool,
        help="true/false: build the model under deepspeed.zero.Init.",
    )
    add(
        ds,
        "--zero3_save_16bit_model",
        type=str_to_bool,
        help="true/false: save 16-bit weights with ZeRO-3.",
    )
    add(ds, "--deepspeed_hostfile", help="DeepSpeed hostfile for several machines.")
    add(ds, "--deepspeed_exclusion_filter", help="DeepSpeed exclusion filter.")
    add(ds, "--deepspeed_inclusion_filter", help="DeepSpeed inclusion filter.")
    add(
        ds,
        "--deepspeed_multinode_launcher",
        type=_lower,
        help="pdsh, standard, openmpi, ... (default: pdsh).",
    )
    add(ds, "--deepspeed_moe_layer_cls_names", help="Comma-separated MoE layer class names.")

    pipeline = parser.add_argument_group("Pipeline parallelism (Cadence only)")
    add(
        pipeline,
        "--parallelism_config_pp_size",
        type=int,
        help="Pipeline stages' processes: ParallelismConfig(pp_size=N) in every worker.",
    )
    add(
        pipeline,
        "--parallelism_config_pp_schedule",
        help="GPipe, 1F1B (default), Interleaved1F1B, InterleavedZeroBubble or ZBVZeroBubble.",
    )

    fsdp = parser.add_argument_group("FSDP (with --use_fsdp)")
    add(fsdp, "--fsdp_version", type=int, choices=[1, 2], help="FSDP version (default: 1).")
    add(
        fsdp,
        "--fsdp_offload_params",
        type=str_to_bool,
        help="true/false: offload parameters to CPU.",
    )
    add(fsdp, "--fsdp_min_num_params", type=int, help="Minimum parameters for size-based wrapping.")
    add(
        fsdp,
        "--fsdp_sharding_strategy",
        type=_upper,
        help="FULL_SHARD (default), SHARD_GRAD_OP, NO_SHARD, ...",
    )
    add(
        fsdp,
        "--fsdp_reshard_after_forward",
        help="true/false (FSDP2) or a sharding strategy (FSDP1).",
    )
    add(
        fsdp,
        "--fsdp_auto_wrap_policy",
        type=_upper,
        help="TRANSFORMER_BASED_WRAP, SIZE_BASED_WRAP or NO_WRAP.",
    )
    add(
        fsdp,
        "--fsdp_transformer_layer_cls_to_wrap",
        help="Comma-separated layer class names to wrap.",
    )
    add(
        fsdp,
        "--fsdp_backward_prefetch",
        type=_upper,
        help="BACKWARD_PRE, BACKWARD_POST or NO_PREFETCH.",
    )
    add(
        fsdp,
        "--fsdp_state_dict_type",
        type=_upper,
        help="FULL_STATE_DICT, LOCAL_STATE_DICT or SHARDED_STATE_DICT.",
    )
    add(
        fsdp,
        "--fsdp_forward_prefetch",
        type=str_to_bool,
        help="true/false: prefetch in the forward pass.",
    )
    add(
        fsdp,
        "--fsdp_use_orig_params",
        type=str_to_bool,
        help="true/false: keep original parameters.",
    )
    add(
        fsdp,
        "--fsdp_cpu_ram_efficient_loading",
        type=str_to_bool,
        help="true/false: load weights on rank 0 only.",
    )
    add(
        fsdp,
        "--fsdp_sync_module_states",
        type=str_to_bool,
        help="true/false: broadcast weights from rank 0.",
    )
    add(
        fsdp,
        "--fsdp_activation_checkpointing",
        type=str_to_bool,
        help="true/false: activation checkpointing.",
    )
    add(fsdp, "--fsdp_activation_checkpointing_offload", type=str_to_bool,
        help="true/false: offload checkpointed activations.")  # fmt: skip

    parser.add_argument(
        "training_script", help="The script (or module with -m) to run, then its own arguments."
    )
    parser.add_argument(
        "training_script_args", nargs=argparse.REMAINDER, help="Arguments of the script."
    )
    return parser, add.option_strings
