"""The questions `cadence config` asks, and two ways to ask them.

On a terminal the questions use `questionary` (arrow-key menus, validation; install it with
``pip install 'cadence[cli]'``). Without a terminal, or without questionary, they are plain numbered
prompts read from standard input, so answers can also be piped in.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from typing import Protocol

from ..launch.args import (
    DEEPSPEED_OFFLOAD_DEVICES,
    DYNAMO_BACKENDS,
    DYNAMO_MODES,
    FSDP_AUTO_WRAP_POLICIES,
    FSDP_BACKWARD_PREFETCH,
    FSDP_SHARDING_STRATEGIES,
    FSDP_STATE_DICT_TYPES,
)
from ..launch.config_file import ClusterConfig
from ..runtime import hardware

Validator = Callable[
    [str], "str | None"
]  # returns an error message, or None when the answer is fine


class ConfigAborted(Exception):
    """The user stopped answering (Ctrl-C or end of input)."""


class Prompter(Protocol):
    """How `cadence config` asks its questions (plain prompts or terminal menus)."""

    def choose(self, message: str, choices: Sequence[str], default: str) -> str:
        """Ask the user to pick one of `choices` (`default` preselected); return the pick."""
        ...

    def text(self, message: str, default: str = "", validate: Validator | None = None) -> str:
        """Ask for free text; `validate` returns an error message or None; return the answer."""
        ...

    def confirm(self, message: str, default: bool = False) -> bool:
        """Ask a yes/no question; return the answer."""
        ...


class PlainPrompter:
    """Numbered questions on standard input/output."""

    def _read(self, prompt: str) -> str:
        try:
            return input(prompt).strip()
        except EOFError:
            raise ConfigAborted("input ended before all questions were answered.") from None
        except KeyboardInterrupt:
            raise ConfigAborted("interrupted.") from None

    def choose(self, message: str, choices: Sequence[str], default: str) -> str:
        """Ask to pick one of `choices` by number or name; empty input picks `default`."""
        print(message)
        for number, choice in enumerate(choices, 1):
            print(f"  {number}) {choice}")
        while True:
            answer = self._read(f"Enter a number [{choices.index(default) + 1}]: ")
            if not answer:
                return default
            if answer.isdigit() and 1 <= int(answer) <= len(choices):
                return choices[int(answer) - 1]
            if answer in choices:
                return answer
            print(f"Please enter a number from 1 to {len(choices)}.")

    def text(self, message: str, default: str = "", validate: Validator | None = None) -> str:
        """Ask for text until `validate` accepts it; empty input gives `default`."""
        while True:
            answer = (
                self._read(f"{message} [{default}]: " if default else f"{message}: ") or default
            )
            problem = validate(answer) if validate else None
            if problem is None:
                return answer
            print(problem)

    def confirm(self, message: str, default: bool = False) -> bool:
        """Ask a yes/no question; empty input gives `default`."""
        while True:
            answer = self._read(f"{message} [{'Y/n' if default else 'y/N'}]: ").lower()
            if not answer:
                return default
            if answer in ("y", "yes"):
                return True
            if answer in ("n", "no"):
                return False
            print("Please answer yes or no.")


class QuestionaryPrompter:
    """Arrow-key menus and validated fields on a terminal."""

    def __init__(self) -> None:
        import questionary

        self._q = questionary

    @staticmethod
    def _ask(question: object) -> object:
        try:
            return question.unsafe_ask()  # type: ignore[attr-defined]
        except KeyboardInterrupt:
            raise ConfigAborted("interrupted.") from None
        except EOFError:
            raise ConfigAborted("input ended before all questions were answered.") from None

    def choose(self, message: str, choices: Sequence[str], default: str) -> str:
        """Ask to pick one of `choices` in an arrow-key menu."""
        question = self._q.select(
            message, choices=list(choices), default=default, use_shortcuts=len(choices) <= 36
        )
        return str(self._ask(question))

    def text(self, message: str, default: str = "", validate: Validator | None = None) -> str:
        """Ask for text in a field that `validate` checks as you type."""

        def check(answer: str) -> bool | str:
            problem = validate(answer) if validate else None
            return True if problem is None else problem

        return str(self._ask(self._q.text(message, default=default, validate=check)))

    def confirm(self, message: str, default: bool = False) -> bool:
        """Ask a yes/no question."""
        return bool(self._ask(self._q.confirm(message, default=default)))


def make_prompter() -> Prompter:
    """Menus on a terminal when questionary is installed; plain prompts otherwise."""
    if sys.stdin.isatty() and sys.stdout.isatty():
        try:
            return QuestionaryPrompter()
        except ImportError:
            print("(install `questionary` for arrow-key menus: pip install 'cadence[cli]')")
    return PlainPrompter()


def _integer(minimum: int, maximum: int | None = None) -> Validator:
    def check(answer: str) -> str | None:
        try:
            value = int(answer)
        except ValueError:
            return "Please enter a whole number."
        if value < minimum or (maximum is not None and value > maximum):
            upper = f" and at most {maximum}" if maximum is not None else ""
            return f"Please enter a number of at least {minimum}{upper}."
        return None

    return check


def _number(answer: str) -> str | None:
    try:
        float(answer)
    except ValueError:
        return "Please enter a number."
    return None


def _required(answer: str) -> str | None:
    return None if answer.strip() else "This answer is required."


MACHINE_TYPES = {
    "No distributed training": "NO",
    "multi-CPU": "MULTI_CPU",
    "multi-GPU": "MULTI_GPU",
}


def _ask_deepspeed(ask: Prompter) -> tuple[dict, bool]:
    settings: dict = {}
    if ask.confirm("Do you want to specify a JSON file with a DeepSpeed config?", False):
        settings["deepspeed_config_file"] = ask.text(
            "Path to the DeepSpeed JSON config file", validate=_required
        )
        uses_file = True
    else:
        uses_file = False
        stage = int(
            ask.choose("Which DeepSpeed ZeRO optimization stage?", ["0", "1", "2", "3"], "2")
        )
        settings["zero_stage"] = stage
        if stage >= 2:
            devices = list(DEEPSPEED_OFFLOAD_DEVICES)
            settings["offload_optimizer_device"] = ask.choose(
                "Where to offload optimizer states?", devices, "none"
            )
            settings["offload_param_device"] = ask.choose(
                "Where to offload parameters?", devices, "none"
            )
            for what in ("param", "optimizer"):
                if settings[f"offload_{what}_device"] == "nvme":
                    settings[f"offload_{what}_nvme_path"] = ask.text(
                        f"NVMe path to offload {what}s", "/nvme"
                    )
        settings["gradient_accumulation_steps"] = int(
            ask.text("How many gradient accumulation steps does your script use?", "1", _integer(1))
        )
        if ask.confirm("Do you want to use gradient clipping?", False):
            settings["gradient_clipping"] = float(
                ask.text("Gradient clipping value", "1.0", _number)
            )
        if stage == 3:
            settings["zero3_save_16bit_model"] = ask.confirm(
                "Save 16-bit model weights with ZeRO stage 3?", False
            )
    settings["zero3_init_flag"] = ask.confirm(
        "Build the model under `deepspeed.zero.Init` (ZeRO stage 3)?", False
    )
    return settings, uses_file


def _ask_fsdp(ask: Prompter) -> dict:
    settings: dict = {"fsdp_version": int(ask.choose("Which FSDP version?", ["1", "2"], "2"))}
    v1 = settings["fsdp_version"] == 1
    if v1:
        settings["fsdp_reshard_after_forward"] = ask.choose(
            "Which sharding strategy?", list(FSDP_SHARDING_STRATEGIES), "FULL_SHARD"
        )
    else:
        settings["fsdp_reshard_after_forward"] = ask.confirm(
            "Reshard parameters after the forward pass?", True
        )
    settings["fsdp_offload_params"] = ask.confirm("Offload parameters and gradients to CPU?", False)
    policy = ask.choose(
        "Which auto wrap policy?", list(FSDP_AUTO_WRAP_POLICIES), FSDP_AUTO_WRAP_POLICIES[0]
    )
    settings["fsdp_auto_wrap_policy"] = policy
    if policy == "TRANSFORMER_BASED_WRAP":
        if not ask.confirm(
            "Use the model's `_no_split_modules` to decide what to wrap (Transformers models)?",
            False,
        ):
            settings["fsdp_transformer_layer_cls_to_wrap"] = ask.text(
                "Comma-separated layer class names to wrap (e.g. BertLayer,GPTJBlock)",
                validate=_required,
            )
    elif policy == "SIZE_BASED_WRAP":
        settings["fsdp_min_num_params"] = int(
            ask.text("Minimum number of parameters per wrapped module", "100000000", _integer(1))
        )
    if v1:
        settings["fsdp_backward_prefetch"] = ask.choose(
            "Which backward prefetch policy?",
            list(FSDP_BACKWARD_PREFETCH),
            FSDP_BACKWARD_PREFETCH[0],
        )
    state_dict_types = (
        list(FSDP_STATE_DICT_TYPES) if v1 else ["FULL_STATE_DICT", "SHARDED_STATE_DICT"]
    )
    settings["fsdp_state_dict_type"] = ask.choose(
        "Which state dict type?", state_dict_types, state_dict_types[0]
    )
    if v1:
        settings["fsdp_forward_prefetch"] = ask.confirm("Prefetch in the forward pass?", False)
        settings["fsdp_use_orig_params"] = ask.confirm(
            "Keep the original parameters (`use_orig_params`)?", True
        )
    efficient = ask.confirm(
        "Load pretrained weights on the first process only (CPU RAM efficient)?", True
    )
    settings["fsdp_cpu_ram_efficient_loading"] = efficient
    if v1:
        settings["fsdp_sync_module_states"] = efficient or ask.confirm(
            "Broadcast module states from rank 0?", True
        )
    settings["fsdp_activation_checkpointing"] = ask.confirm("Use activation checkpointing?", False)
    return settings


def _ask_dynamo(ask: Prompter) -> dict:
    if not ask.confirm(
        "Do you wish to optimize your script with torch dynamo (torch.compile)?", False
    ):
        return {}
    backends = [
        b for b in DYNAMO_BACKENDS if b not in ("no", "torhchxla_trace_once")
    ]  # skip the legacy typo
    settings: dict = {
        "dynamo_backend": ask.choose("Which dynamo backend?", backends, "inductor").upper()
    }
    if ask.confirm("Do you want to customize the defaults sent to torch.compile?", False):
        settings["dynamo_mode"] = ask.choose("Which mode?", list(DYNAMO_MODES), "default")
        settings["dynamo_use_fullgraph"] = ask.confirm(
            "Compile the full graph (no graph breaks)?", False
        )
        settings["dynamo_use_dynamic"] = ask.confirm("Enable dynamic shape tracing?", False)
        settings["dynamo_use_regional_compilation"] = ask.confirm(
            "Enable regional compilation?", False
        )
    return settings


def ask_config(
    ask: Prompter, gpu_count: int | None = None, cpu_count: int | None = None
) -> ClusterConfig:
    """Ask the questions that matter for this machine and return the resulting config."""
    gpus = hardware.visible_gpu_count() if gpu_count is None else gpu_count
    cores = hardware.usable_cpu_count() if cpu_count is None else cpu_count
    environment = ask.choose(
        "In which compute environment are you running?",
        ["This machine", "AWS (Amazon SageMaker)"],
        "This machine",
    )
    if environment != "This machine":
        raise ConfigAborted(
            "Amazon SageMaker is not supported by cadence launch; choose 'This machine'."
        )
    default_type = "multi-GPU" if gpus > 1 else "No distributed training"
    distributed_type = MACHINE_TYPES[
        ask.choose("Which type of machine are you using?", list(MACHINE_TYPES), default_type)
    ]
    multi = distributed_type != "NO"

    config = ClusterConfig(distributed_type=distributed_type, num_processes=1, same_network=True)
    if multi:
        config.num_machines = int(
            ask.text(
                "How many machines will you use (more than 1 for multi-node training)?",
                "1",
                _integer(1),
            )
        )
        if config.num_machines > 1:
            config.machine_rank = int(
                ask.choose(
                    "What is the rank of this machine?",
                    [str(i) for i in range(config.num_machines)],
                    "0",
                )
            )
            config.main_process_ip = ask.text(
                "What is the IP address of the machine that hosts the main process?",
                validate=_required,
            )
            config.main_process_port = int(
                ask.text("Which port will the main process use?", "29500", _integer(1, 65535))
            )
            config.same_network = ask.confirm(
                "Are all the machines on the same local network?", True
            )
            if not config.same_network:
                config.rdzv_backend = ask.choose(
                    "Which rendezvous backend will you use?", ["static", "c10d"], "static"
                )
        config.debug = ask.confirm(
            "Check distributed operations for errors while running (slower, avoids hangs)?", False
        )

    if distributed_type == "NO":
        config.use_cpu = ask.confirm("Run on CPU only (even if a GPU is available)?", gpus == 0)
    else:
        config.use_cpu = distributed_type == "MULTI_CPU"

    config.dynamo_config = _ask_dynamo(ask)

    uses_ds_file = False
    if not config.use_cpu and distributed_type in ("NO", "MULTI_GPU"):
        if ask.confirm("Do you want to use DeepSpeed?", False):
            config.distributed_type = "DEEPSPEED"
            config.deepspeed_config, uses_ds_file = _ask_deepspeed(ask)
    if config.distributed_type in ("MULTI_GPU", "MULTI_CPU"):
        if ask.confirm("Do you want to use FullyShardedDataParallel (FSDP)?", False):
            config.distributed_type = "FSDP"
            config.fsdp_config = _ask_fsdp(ask)

    if multi or config.distributed_type == "DEEPSPEED":
        unit = "processes" if config.use_cpu else "GPU(s)"
        suggested = (
            max(2, cores if config.use_cpu else gpus)
            if config.num_machines == 1
            else max(1, gpus or 1)
        )
        minimum = 2 if config.num_machines == 1 and config.distributed_type != "DEEPSPEED" else 1
        per_machine = int(
            ask.text(
                f"How many {unit} should be used per machine?", str(suggested), _integer(minimum)
            )
        )
        config.num_processes = per_machine * config.num_machines
    if not config.use_cpu and gpus > 0:
        config.gpu_ids = ask.text(
            "Which GPUs (by id) should be used on this machine, comma-separated?", "all"
        )
    if config.distributed_type in ("NO", "MULTI_GPU") and not config.use_cpu and gpus > 0:
        config.enable_cpu_affinity = ask.confirm(
            "Pin each process to the CPU cores near its GPU (NUMA affinity)?", False
        )
    if uses_ds_file:
        config.mixed_precision = None  # the DeepSpeed file decides
    else:
        config.mixed_precision = ask.choose(
            "Do you wish to use mixed precision?", ["no", "fp16", "bf16", "fp8"], "no"
        )
    return config
