"""The config file written by `cadence config` and read by `cadence launch`.

The format is Accelerate's YAML (or JSON) file, so a file written by `accelerate config`
works unchanged. Older versions of the format are upgraded on load (see `upgrade_config_dict`);
`cadence config update` writes the upgraded form back. Keys nobody knows are an error that lists them.

Default location, first match wins: ``$HF_HOME/cadence/default_config.yaml``,
``$XDG_CACHE_HOME/huggingface/cadence/default_config.yaml``,
``~/.cache/huggingface/cadence/default_config.yaml``.

This module must stay free of torch imports: `cadence --help` and `cadence config` load it.
"""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..precision.choice import MIXED_PRECISION_CHOICES
from ..runtime.hardware import visible_gpu_count

LOCAL_MACHINE = "LOCAL_MACHINE"
AMAZON_SAGEMAKER = "AMAZON_SAGEMAKER"
COMPUTE_ENVIRONMENTS = (LOCAL_MACHINE, AMAZON_SAGEMAKER)

# Every value the reference has ever written for `distributed_type` on a local machine
# ("TPU" is the pre-XLA spelling, upgraded on load).
CLUSTER_DISTRIBUTED_TYPES = (
    "NO",
    "MULTI_CPU",
    "MULTI_GPU",
    "MULTI_NPU",
    "MULTI_MLU",
    "MULTI_SDAA",
    "MULTI_MUSA",
    "MULTI_XPU",
    "MULTI_HPU",
    "MULTI_NEURON",
    "DEEPSPEED",
    "FSDP",
    "XLA",
    "MEGATRON_LM",
)
SAGEMAKER_DISTRIBUTED_TYPES = ("NO", "DATA_PARALLEL", "MODEL_PARALLEL")

# Keys older versions wrote that no longer exist, with what replaced them (for messages).
OBSOLETE_KEYS = {
    "fp16": "mixed_precision",
    "dynamo_backend": "dynamo_config.dynamo_backend",
    "ipex_config": "nothing (Intel extensions are part of PyTorch now)",
}


class ConfigFileError(ValueError):
    """A config file is missing, unreadable, or holds keys or values Cadence does not understand."""


def default_config_dir(env: dict[str, str] | None = None) -> Path:
    """The folder holding the default config file, computed from the environment at call time."""
    env = os.environ if env is None else env
    if env.get("HF_HOME"):
        hf_home = env["HF_HOME"]
    else:
        cache = env.get("XDG_CACHE_HOME") or os.path.join("~", ".cache")
        hf_home = os.path.join(cache, "huggingface")
    return Path(os.path.expanduser(hf_home)) / "cadence"


def default_config_path(env: dict[str, str] | None = None) -> Path:
    """Where `cadence config` writes and `cadence launch` looks when no `--config_file` is given."""
    return default_config_dir(env) / "default_config.yaml"


def __getattr__(name: str) -> Any:
    # `default_config_file` mirrors the reference's module attribute but follows later env changes.
    if name == "default_config_file":
        return str(default_config_path())
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@dataclass
class _BaseConfig:
    """The settings every config file holds, whatever its compute environment (public as
    `cadence.commands.config.config_args.BaseConfig`).

    `to_dict`, `to_json_file` and `to_yaml_file` write the file; every field has a default, so a file
    may leave any key out.

    Attributes:
        compute_environment (str): "LOCAL_MACHINE" or "AMAZON_SAGEMAKER".
        distributed_type (str): "NO", "MULTI_CPU", "MULTI_GPU", "DEEPSPEED", "FSDP", "XLA" ...
        mixed_precision (str | None): "no", "fp16", "bf16" or "fp8".
        use_cpu (bool): Run on the CPU even where an accelerator is present.
        debug (bool): Check collectives for shape mismatches across processes (debug mode).
    """

    compute_environment: str = LOCAL_MACHINE
    distributed_type: str = "NO"
    mixed_precision: str | None = "no"
    use_cpu: bool = False
    debug: bool = False

    def to_dict(self) -> dict[str, Any]:
        """The file's content: values that are None, and empty sections, are left out (as Accelerate does)."""
        result = {}
        for name, value in dataclasses.asdict(self).items():
            if value is None or (isinstance(value, dict) and not value):
                continue
            result[name] = value
        return result

    def save(self, path: str | os.PathLike[str], as_json: bool | None = None) -> Path:
        """Write YAML, or JSON when the file name ends in `.json`; creates the parent folder.

        Args:
            path (str | os.PathLike[str]): The file to write.
            as_json (bool | None): JSON (True) or YAML (False) whatever the name; None (default)
                decides by the name.

        Returns:
            Path: The file written.
        """
        target = Path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        content = self.to_dict()
        if as_json or (as_json is None and target.suffix == ".json"):
            text = json.dumps(content, indent=2, sort_keys=True) + "\n"
        else:
            import yaml

            text = yaml.safe_dump(content)
        target.write_text(text, encoding="utf-8")
        return target

    # Reference-compatible spellings.
    def to_yaml_file(self, yaml_file: str | os.PathLike[str]) -> None:
        """Write the config to `yaml_file` (Accelerate's name for `save`).

        Args:
            yaml_file (str | os.PathLike[str]): The file to write, in YAML whatever its name.
        """
        self.save(yaml_file, as_json=False)

    def to_json_file(self, json_file: str | os.PathLike[str]) -> None:
        """Write the config to `json_file` (Accelerate's name for `save`).

        Args:
            json_file (str | os.PathLike[str]): The file to write, in JSON whatever its name (as
                Accelerate does).
        """
        self.save(json_file, as_json=True)


@dataclass
class ClusterConfig(_BaseConfig):
    """A config for this machine or a cluster of machines (``compute_environment: LOCAL_MACHINE``).

    Attributes:
        compute_environment (str): "LOCAL_MACHINE" or "AMAZON_SAGEMAKER".
        distributed_type (str): "NO", "MULTI_CPU", "MULTI_GPU", "DEEPSPEED", "FSDP", "XLA" ...
        mixed_precision (str | None): "no", "fp16", "bf16" or "fp8".
        use_cpu (bool): Run on the CPU even where an accelerator is present.
        debug (bool): Check collectives for shape mismatches across processes (debug mode).
        num_processes (int): Processes in all, over every machine (-1: not set, the launcher decides).
        machine_rank (int): This machine's rank, from 0.
        num_machines (int): How many machines take part.
        gpu_ids (str | None): The GPUs to use, "all" or indices separated by commas.
        main_process_ip (str | None): The address of the machine of rank 0.
        main_process_port (int | None): Its rendezvous port.
        rdzv_backend (str | None): torch elastic's rendezvous backend ("static" or "c10d").
        same_network (bool | None): Whether all the machines share a local network.
        main_training_function (str): The function a notebook or TPU launch calls.
        enable_cpu_affinity (bool): Pin each process to the CPUs near its GPU.
        fp8_config (dict[str, Any]): The FP8 settings.
        deepspeed_config (dict[str, Any]): The DeepSpeed settings.
        fsdp_config (dict[str, Any]): The FSDP settings.
        parallelism_config (dict[str, Any]): The tensor/context/data parallel sizes.
        megatron_lm_config (dict[str, Any]): The Megatron-LM settings.
        mpirun_config (dict[str, Any]): The settings of an mpirun launch on CPUs.
        downcast_bf16 (bool | str): On TPU with bf16, turn float32 into bf16 but float64 only into
            float32 (`XLA_DOWNCAST_BF16`), instead of turning both into bf16.
        tpu_name (str | None): The TPU pod's name (for `tpu-config`).
        tpu_zone (str | None): Its zone.
        tpu_use_cluster (bool): Launch on every host of the pod.
        tpu_use_sudo (bool): Run the pod's setup commands with sudo.
        command_file (str | None): A file of setup commands for the pod's hosts.
        commands (list[str] | None): Setup commands for the pod's hosts.
        tpu_vm (list[str] | None): The pod's VM names.
        tpu_env (list[str] | None): Environment variables set on the pod's hosts.
        dynamo_config (dict[str, Any]): The `torch.compile` settings (backend, mode ...).
    """

    num_processes: int = -1
    machine_rank: int = 0
    num_machines: int = 1
    gpu_ids: str | None = None
    main_process_ip: str | None = None
    main_process_port: int | None = None
    rdzv_backend: str | None = "static"
    same_network: bool | None = False
    main_training_function: str = "main"
    enable_cpu_affinity: bool = False
    fp8_config: dict[str, Any] = field(default_factory=dict)
    deepspeed_config: dict[str, Any] = field(default_factory=dict)
    fsdp_config: dict[str, Any] = field(default_factory=dict)
    parallelism_config: dict[str, Any] = field(default_factory=dict)
    megatron_lm_config: dict[str, Any] = field(default_factory=dict)
    mpirun_config: dict[str, Any] = field(default_factory=dict)
    downcast_bf16: bool | str = False
    tpu_name: str | None = None
    tpu_zone: str | None = None
    tpu_use_cluster: bool = False
    tpu_use_sudo: bool = False
    command_file: str | None = None
    commands: list[str] | None = None
    tpu_vm: list[str] | None = None
    tpu_env: list[str] | None = None
    dynamo_config: dict[str, Any] = field(default_factory=dict)


@dataclass
class SageMakerConfig(_BaseConfig):
    """A config for Amazon SageMaker (recognised so such files load; `cadence launch` cannot run them).

    Attributes:
        compute_environment (str): "LOCAL_MACHINE" or "AMAZON_SAGEMAKER".
        distributed_type (str): "NO", "MULTI_CPU", "MULTI_GPU", "DEEPSPEED", "FSDP", "XLA" ...
        mixed_precision (str | None): "no", "fp16", "bf16" or "fp8".
        use_cpu (bool): Run on the CPU even where an accelerator is present.
        debug (bool): Check collectives for shape mismatches across processes (debug mode).
        ec2_instance_type (str): The instance type of the job.
        iam_role_name (str): The IAM role the job runs as.
        image_uri (str | None): A custom container image.
        profile (str | None): The AWS profile.
        region (str): The AWS region (default "us-east-1").
        num_machines (int): How many instances.
        gpu_ids (str): The GPUs to use (default "all").
        base_job_name (str | None): The prefix of the job's name.
        pytorch_version (str | None): The PyTorch version of the container.
        transformers_version (str | None): The Transformers version of the container.
        py_version (str | None): The Python version of the container.
        sagemaker_inputs_file (str | None): A file naming the job's input channels.
        sagemaker_metrics_file (str | None): A file of metric definitions.
        additional_args (dict[str, Any] | None): Further estimator arguments.
        dynamo_config (dict[str, Any]): The `torch.compile` settings.
        enable_cpu_affinity (bool): Pin each process to the CPUs near its GPU.
    """

    ec2_instance_type: str = ""
    iam_role_name: str = ""
    image_uri: str | None = None
    profile: str | None = None
    region: str = "us-east-1"
    num_machines: int = 1
    gpu_ids: str = "all"
    base_job_name: str | None = None
    pytorch_version: str | None = None
    transformers_version: str | None = None
    py_version: str | None = None
    sagemaker_inputs_file: str | None = None
    sagemaker_metrics_file: str | None = None
    additional_args: dict[str, Any] | None = None
    dynamo_config: dict[str, Any] = field(default_factory=dict)
    enable_cpu_affinity: bool = False


ConfigFile = ClusterConfig | SageMakerConfig

_DICT_KEYS = {f.name for f in dataclasses.fields(ClusterConfig) if f.name.endswith("_config")}
_INT_KEYS = {"num_processes", "machine_rank", "num_machines", "main_process_port"}
# Text settings (None allowed); gpu_ids may also be a number (YAML reads `gpu_ids: 0` as one).
_STR_KEYS = {
    "compute_environment",
    "main_training_function",
    "main_process_ip",
    "rdzv_backend",
    "command_file",
    "tpu_name",
    "tpu_zone",
    "ec2_instance_type",
    "iam_role_name",
    "image_uri",
    "profile",
    "region",
    "base_job_name",
    "sagemaker_inputs_file",
    "sagemaker_metrics_file",
}
_LIST_KEYS = {"commands", "tpu_vm", "tpu_env"}
_BOOL_KEYS = {
    "use_cpu",
    "debug",
    "same_network",
    "enable_cpu_affinity",
    "tpu_use_cluster",
    "tpu_use_sudo",
}


def upgrade_config_dict(raw: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """Bring a config written by any version of the format to the current one.

    Returns the new dict and one note per change, for `cadence config update` to report.
    """
    data = dict(raw)
    notes: list[str] = []
    # YAML 1.1 reads an unquoted NO / no as false: that is what a hand-written "distributed_type: NO" means.
    if data.get("distributed_type") is False:
        data["distributed_type"] = "NO"
    if data.get("mixed_precision") is False:
        data["mixed_precision"] = "no"
    if data.get("dynamo_backend") is False:
        data["dynamo_backend"] = "NO"
    if "compute_environment" not in data:
        data["compute_environment"] = LOCAL_MACHINE
        notes.append("added compute_environment: LOCAL_MACHINE")
    if "fp16" in data:
        fp16 = data.pop("fp16")
        if "mixed_precision" not in data:
            data["mixed_precision"] = "fp16" if fp16 else "no"
        notes.append(f"replaced fp16: {fp16} by mixed_precision: {data['mixed_precision']}")
    if "dynamo_backend" in data and isinstance(data.get("dynamo_config") or {}, dict):
        backend = data.pop("dynamo_backend")
        dynamo = {} if str(backend).upper() == "NO" else {"dynamo_backend": str(backend).upper()}
        data["dynamo_config"] = {**dynamo, **(data.get("dynamo_config") or {})}
        notes.append(f"moved dynamo_backend: {backend} into dynamo_config")
    if "ipex_config" in data:
        data.pop("ipex_config")
        notes.append("dropped ipex_config (Intel CPU extensions are built into PyTorch now)")
    if data.get("distributed_type") == "TPU":
        data["distributed_type"] = "XLA"
        notes.append("renamed distributed_type TPU to XLA")
    if "mixed_precision" not in data:
        data["mixed_precision"] = "no"
        notes.append("added mixed_precision: 'no'")
    for flag in ("use_cpu", "debug", "enable_cpu_affinity"):
        if flag not in data:
            data[flag] = False
            notes.append(f"added {flag}: false")
    if (
        "num_processes" not in data
        and data.get("distributed_type") == "NO"
        and data.get("compute_environment") == LOCAL_MACHINE
    ):
        data["num_processes"] = 1
        notes.append("added num_processes: 1")
    return data, notes


def _check_types(data: dict[str, Any], where: str) -> None:
    problems = []
    for key, value in data.items():
        if value is None:
            continue
        if key in _INT_KEYS and (isinstance(value, bool) or not isinstance(value, int)):
            problems.append(f"{key} must be an integer, got {value!r}")
        elif key in _BOOL_KEYS and not isinstance(value, bool):
            problems.append(f"{key} must be true or false, got {value!r}")
        elif key in _DICT_KEYS and not isinstance(value, dict):
            problems.append(f"{key} must be a mapping, got {value!r}")
        elif key in _DICT_KEYS and not all(isinstance(name, str) for name in value):
            names = ", ".join(repr(name) for name in value if not isinstance(name, str))
            problems.append(f"{key} has keys that are not names: {names}")
        elif key in _STR_KEYS and not isinstance(value, str):
            problems.append(f"{key} must be text, got {value!r}")
        elif key in _LIST_KEYS and not isinstance(value, list):
            problems.append(f"{key} must be a list, got {value!r}")
        elif key == "gpu_ids" and (isinstance(value, bool) or not isinstance(value, (str, int))):
            problems.append(
                f"gpu_ids must be 'all' or comma-separated GPU numbers like 0,1, got {value!r}"
            )
        elif key == "downcast_bf16" and not isinstance(value, (bool, str)):
            problems.append(f"downcast_bf16 must be true, false or 'no', got {value!r}")
    mixed = data.get("mixed_precision")
    if mixed is not None and str(mixed).lower() not in MIXED_PRECISION_CHOICES:
        problems.append(
            f"mixed_precision must be one of {', '.join(MIXED_PRECISION_CHOICES)}, got {mixed!r}"
        )
    if problems:
        raise ConfigFileError(
            f"The config file {where} has invalid values:\n  - " + "\n  - ".join(problems)
        )


def config_from_dict(raw: Any, where: str = "<dict>") -> ConfigFile:
    """Validate and upgrade a parsed config file; `where` names the file in error messages."""
    if not isinstance(raw, dict):
        kind = (
            "empty" if raw is None else f"a {type(raw).__name__}, not a mapping of keys to values"
        )
        raise ConfigFileError(
            f"The config file {where} is {kind}. Write it with `cadence config` or `cadence config default`."
        )
    odd_keys = [key for key in raw if not isinstance(key, str)]
    if odd_keys:
        raise ConfigFileError(
            f"The config file {where} has keys that are not setting names: "
            f"{', '.join(repr(key) for key in odd_keys)}. Every line must look like `name: value`."
        )
    if not isinstance(raw.get("dynamo_config") or {}, dict):
        raise ConfigFileError(
            f"The config file {where} has invalid values:\n  - dynamo_config must be a mapping, got "
            f"{raw['dynamo_config']!r}"
        )
    data, _ = upgrade_config_dict(raw)
    environment = data["compute_environment"]
    if environment not in COMPUTE_ENVIRONMENTS:
        raise ConfigFileError(
            f"The config file {where} has compute_environment: {environment!r}; expected one of "
            f"{', '.join(COMPUTE_ENVIRONMENTS)}."
        )
    cls = ClusterConfig if environment == LOCAL_MACHINE else SageMakerConfig
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - known)
    if unknown:
        raise ConfigFileError(
            f"The config file {where} has unknown keys: {', '.join(unknown)}. Remove them, or check their "
            "spelling against a file written by `cadence config`."
        )
    if "distributed_type" not in data:
        raise ConfigFileError(
            f"The config file {where} has no distributed_type. Add one (e.g. distributed_type: MULTI_CPU) "
            "or write the file again with `cadence config`."
        )
    allowed = CLUSTER_DISTRIBUTED_TYPES if cls is ClusterConfig else SAGEMAKER_DISTRIBUTED_TYPES
    if data["distributed_type"] not in allowed:
        raise ConfigFileError(
            f"The config file {where} has distributed_type: {data['distributed_type']!r}; expected one of "
            f"{', '.join(allowed)}."
        )
    _check_types(data, where)
    for name in _DICT_KEYS & set(data):
        if data[name] is None:
            data[name] = {}
    if isinstance(data.get("gpu_ids"), int) and not isinstance(data["gpu_ids"], bool):
        data["gpu_ids"] = str(data["gpu_ids"])  # YAML reads `gpu_ids: 0` as a number
    if isinstance(data.get("mixed_precision"), str):
        data["mixed_precision"] = data["mixed_precision"].lower()
    return cls(**data)


def read_config_dict(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The raw mapping stored in a YAML or JSON config file, without upgrading or validating it."""
    source = Path(path)
    if source.is_dir():
        raise ConfigFileError(
            f"The config file {source} is a folder, not a file. Pass the file itself (e.g. "
            f"{source / 'default_config.yaml'}) with --config_file."
        )
    if not source.is_file():
        raise ConfigFileError(
            f"The config file {source} does not exist. Create it with `cadence config` (or "
            "`cadence config default`), or pass an existing file with --config_file."
        )
    try:
        if source.suffix == ".json":
            try:
                return json.loads(source.read_text(encoding="utf-8"))
            except json.JSONDecodeError as err:
                raise ConfigFileError(
                    f"The config file {source} is not valid JSON: {err}."
                ) from None
        import yaml

        try:
            with source.open(encoding="utf-8") as handle:  # a stream, so errors name the file
                return yaml.safe_load(handle)
        except yaml.YAMLError as err:
            raise ConfigFileError(
                f"The config file {source} is not valid YAML:\n{err}\nFix the file or write it again "
                "with `cadence config`."
            ) from None
    except UnicodeDecodeError as err:
        raise ConfigFileError(
            f"The config file {source} is not UTF-8 text ({err.reason} at byte {err.start}); write it "
            "again with `cadence config`."
        ) from None
    except (OSError, RecursionError) as err:
        reason = err.strerror if isinstance(err, OSError) and err.strerror else type(err).__name__
        raise ConfigFileError(
            f"The config file {source} cannot be read ({reason}); check its permissions, or write it "
            "again with `cadence config`."
        ) from None


def load_config_from_file(config_file: str | os.PathLike[str] | None = None) -> ConfigFile:
    """Read, upgrade and validate a config file (the default one when `config_file` is None)."""
    path = Path(config_file) if config_file is not None else default_config_path()
    return config_from_dict(read_config_dict(path), where=str(path))


def update_config_file(config_file: str | os.PathLike[str] | None = None) -> tuple[Path, list[str]]:
    """Rewrite a config file in the current format; returns its path and what changed."""
    path = Path(config_file) if config_file is not None else default_config_path()
    raw = read_config_dict(path)
    config = config_from_dict(raw, where=str(path))
    _, notes = upgrade_config_dict(raw) if isinstance(raw, dict) else ({}, [])
    config.save(path)
    return path, notes


def basic_config(mixed_precision: str = "no", gpu_count: int | None = None) -> ClusterConfig:
    """A config for this machine: every visible GPU when there are several, otherwise one process."""
    mixed_precision = str(mixed_precision).lower()
    if mixed_precision not in MIXED_PRECISION_CHOICES:
        raise ConfigFileError(
            f"mixed_precision must be one of {', '.join(MIXED_PRECISION_CHOICES)}, got {mixed_precision!r}."
        )
    if gpu_count is None:
        gpu_count = visible_gpu_count()
    if gpu_count > 0:
        distributed_type = "MULTI_GPU" if gpu_count > 1 else "NO"
        num_processes, use_cpu = gpu_count, False
    else:
        distributed_type, num_processes, use_cpu = "NO", 1, True
    return ClusterConfig(
        compute_environment=LOCAL_MACHINE,
        distributed_type=distributed_type,
        mixed_precision=mixed_precision,
        num_processes=num_processes,
        use_cpu=use_cpu,
        debug=False,
        enable_cpu_affinity=False,
    )


def write_basic_config(
    mixed_precision: str = "no", save_location: str | os.PathLike[str] | None = None
) -> Path | bool:
    """Write `basic_config()` to `save_location` (default location when None).

    Returns the path, or False (after saying so) when a file is already there: an existing config
    is never overwritten.

    Args:
        mixed_precision (str): "no", "fp16", "bf16" or "fp8" (default "no").
        save_location (str | os.PathLike[str] | None): The file to write; None means the default
            location.

    Returns:
        Path | bool: As described above.
    """
    path = Path(save_location) if save_location is not None else default_config_path()
    config = basic_config(mixed_precision)
    if path.exists():
        print(
            f"Configuration already exists at {path}, will not override. Run `cadence config` to change it, "
            "or pass a different location."
        )
        return False
    # JSON whatever the name, as Accelerate writes it (`default_config.yaml` holds JSON, which a
    # YAML reader reads too): the files the two write are the same bytes.
    return config.save(path, as_json=True)
