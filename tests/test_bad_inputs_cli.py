"""Bad config files and bad `cadence launch` flags: a clear error (exit code 2 for launch), never a
traceback, and nothing written or started.

Tables of known mistakes first, then a few real `cadence` subprocesses, then hypothesis fuzzers over
the config-file loader (documents and mappings of random keys and values, also fed to the launch
planner) and over the `cadence launch` command line (random flag lists, in-process with --dry_run).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from cadence.commands.cli import main as cadence_main
from cadence.launch.args import build_launch_parser
from cadence.launch.config_file import (
    CLUSTER_DISTRIBUTED_TYPES,
    ClusterConfig,
    ConfigFileError,
    SageMakerConfig,
    config_from_dict,
    load_config_from_file,
    write_basic_config,
)
from cadence.launch.plan import LaunchPlan, LaunchPlanError, build_plan

CADENCE = [sys.executable, "-m", "cadence.commands.cli"]
# Bounded for CI; raise it to fuzz harder locally (e.g. CADENCE_FUZZ_EXAMPLES=5000).
FUZZ_EXAMPLES = int(os.environ.get("CADENCE_FUZZ_EXAMPLES", "80"))
FUZZ_SETTINGS = settings(
    max_examples=FUZZ_EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    """A folder with a script, a good and a bad config file; no default config, no CADENCE_* variables."""
    root = tmp_path_factory.mktemp("bad-inputs-cli")
    (root / "train.py").write_text("print('trained')\n")
    (root / "touch.py").write_text(
        "import pathlib\npathlib.Path('started.marker').write_text('x')\n"
    )
    (root / "good.yaml").write_text(
        yaml.safe_dump({"distributed_type": "MULTI_CPU", "num_processes": 2, "use_cpu": True})
    )
    (root / "bad.yaml").write_text("distributed_type: MULTI_CPU\nnum_processes: [2\n")
    with pytest.MonkeyPatch.context() as patch:
        for name in list(os.environ):
            if name.startswith(("CADENCE_", "ACCELERATE_")):
                patch.delenv(name)
        patch.setenv("HF_HOME", str(root / "hf-home"))
        patch.delenv("XDG_CACHE_HOME", raising=False)
        patch.chdir(root)
        yield root


def write(path: Path, content: str | bytes) -> Path:
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content, encoding="utf-8")
    return path


# -- config files ------------------------------------------------------------------------------------
BAD_CONFIG_FILES = {
    "a list": ("c.yaml", "- 1\n- 2\n", "not a mapping"),
    "empty": ("c.yaml", "", "is empty"),
    "broken yaml": ("c.yaml", "distributed_type: [NO\n", "not valid YAML"),
    "broken json": ("c.json", '{"distributed_type": ', "not valid JSON"),
    "not utf-8": ("c.yaml", b"distributed_type: \xff\xfe\n", "not UTF-8"),
    "number as a word": (
        "c.yaml",
        "distributed_type: NO\nnum_processes: two\n",
        "num_processes must be an integer",
    ),
    "unknown distributed type": ("c.yaml", "distributed_type: WARP\n", "distributed_type: 'WARP'"),
    "unknown key": ("c.yaml", "distributed_type: NO\nnum_gpus: 2\n", "unknown keys: num_gpus"),
    "numeric key": ("c.yaml", "distributed_type: NO\n1: 2\n", "not setting names"),
    "section not a mapping": (
        "c.yaml",
        "distributed_type: NO\nfsdp_config: 5\n",
        "fsdp_config must be a mapping",
    ),
    "section with numeric keys": (
        "c.yaml",
        "distributed_type: NO\nfsdp_config: {1: 2}\n",
        "not names",
    ),
    "old dynamo key with a bad section": (
        "c.yaml",
        "distributed_type: NO\ndynamo_backend: EAGER\ndynamo_config: [1]\n",
        "dynamo_config must be a mapping",
    ),
    "gpu ids as a list": ("c.yaml", "distributed_type: NO\ngpu_ids: [0, 1]\n", "comma-separated"),
    "flag as text": (
        "c.yaml",
        "distributed_type: NO\nuse_cpu: maybe\n",
        "use_cpu must be true or false",
    ),
    "unknown precision": (
        "c.json",
        '{"distributed_type": "NO", "mixed_precision": "fp32"}',
        "mixed_precision must be one of",
    ),
}


@pytest.mark.parametrize("case", list(BAD_CONFIG_FILES))
def test_bad_config_files_are_refused_with_the_reason(case, tmp_path):
    name, content, phrase = BAD_CONFIG_FILES[case]
    path = write(tmp_path / name, content)
    with pytest.raises(ConfigFileError, match=re.escape(phrase)) as caught:
        load_config_from_file(path)
    assert str(path) in str(caught.value)  # the message names the file


def test_missing_config_and_folder_say_what_to_pass(tmp_path):
    with pytest.raises(ConfigFileError, match="does not exist.*cadence config"):
        load_config_from_file(tmp_path / "nowhere.yaml")
    with pytest.raises(ConfigFileError, match="is a folder"):
        load_config_from_file(tmp_path)


def test_a_sagemaker_config_without_processes_still_loads():
    # Upgrading must not add a key that only local-machine configs have.
    loaded = config_from_dict({"compute_environment": "AMAZON_SAGEMAKER", "distributed_type": "NO"})
    assert isinstance(loaded, SageMakerConfig)


def test_write_basic_config_with_a_bad_precision_writes_nothing(tmp_path):
    target = tmp_path / "sub" / "config.yaml"
    with pytest.raises(ConfigFileError, match="mixed_precision must be one of"):
        write_basic_config("fp64", target)
    assert not target.exists() and not target.parent.exists()


# -- launch flags (in-process) -------------------------------------------------------------------------
def plan_for(argv: list[str], env: dict[str, str] | None = None, gpus: int = 0) -> LaunchPlan:
    parser, _ = build_launch_parser()
    args, unknown = parser.parse_known_args(argv)
    assert not unknown
    return build_plan(args, env={} if env is None else env, gpu_count=lambda: gpus)


BAD_PLANS = {
    "no processes": (
        ["--num_processes", "0", "train.py"],
        {},
        "--num_processes must be at least 1",
    ),
    "rank outside the machines": (
        ["--machine_rank", "3", "train.py"],
        {},
        "--machine_rank 3 must be in [0, 1)",
    ),
    "processes not divisible": (
        [
            "--num_processes",
            "3",
            "--num_machines",
            "2",
            "--main_process_ip",
            "10.0.0.1",
            "train.py",
        ],
        {},
        "must be divisible by --num_machines 2",
    ),
    "port out of range": (["--main_process_port", "70000", "train.py"], {}, "is not a TCP port"),
    "monitor interval nan": (
        ["--monitor_interval", "nan", "train.py"],
        {},
        "--monitor_interval must be a positive",
    ),
    "log dir is a file": (["--log_dir", "train.py", "train.py"], {}, "is a file; pass a folder"),
    "gpu ids on cpu": (["--gpu_ids", "0;1", "train.py"], {}, "--gpu_ids '0;1' must be 'all'"),
    "tee": (["--tee", "9", "train.py"], {}, "--tee '9' must be 0"),
    "rendezvous conf": (["--rdzv_conf", "timeout", "train.py"], {}, "is not key=value"),
    "two paradigms": (["--cpu", "--use_fsdp", "train.py"], {}, "cannot be used together"),
    "fsdp flag without fsdp": (
        ["--fsdp_version", "2", "train.py"],
        {},
        "only applies with --use_fsdp",
    ),
    "missing script": (["nowhere.py"], {}, "does not exist"),
    "bad environment value": (
        ["train.py"],
        {"CADENCE_NUM_PROCESSES": "many"},
        "CADENCE_NUM_PROCESSES='many'",
    ),
    "missing config file": (["--config_file", "nowhere.yaml", "train.py"], {}, "does not exist"),
}


@pytest.mark.parametrize("case", list(BAD_PLANS))
def test_bad_launch_flags_are_refused(case, workdir):
    argv, env, phrase = BAD_PLANS[case]
    with pytest.raises(LaunchPlanError, match=re.escape(phrase)):
        plan_for(argv, env)


def test_wrong_types_inside_config_sections_are_plan_errors(workdir, tmp_path):
    config = tmp_path / "fsdp.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "distributed_type": "FSDP",
                "fsdp_config": {"fsdp_min_num_params": [1], "fsdp_version": "x"},
            }
        )
    )
    with pytest.raises(LaunchPlanError) as caught:
        plan_for(["--config_file", str(config), "train.py"])
    assert "fsdp_min_num_params: [1] is not valid" in str(caught.value)
    assert "fsdp_version: 'x' is not valid" in str(caught.value)


PARSER_ERRORS = {
    "not a number": ["--num_processes", "two", "train.py"],
    "unknown choice": ["--mixed_precision", "fp32", "train.py"],
    "missing value": ["--num_processes"],
    "no script": [],
    "not a boolean": ["--use_fsdp", "--fsdp_offload_params", "perhaps", "train.py"],
}


@pytest.mark.parametrize("case", list(PARSER_ERRORS))
def test_parser_errors_exit_with_code_2_and_usage(case, workdir):
    code, out, err = run_in_process(PARSER_ERRORS[case])
    assert code == 2
    assert "usage:" in err and "error:" in err and "Traceback" not in err


# -- real processes: nothing is started, nothing is written -------------------------------------------
def test_refused_launches_start_nothing(workdir):
    cases = {
        "bad value": ["launch", "--num_processes", "0", "touch.py"],
        "unknown flag": ["launch", "--num_gpus", "2", "touch.py"],
        "bad config file": ["launch", "--config_file", "bad.yaml", "touch.py"],
    }
    for name, argv in cases.items():
        done = subprocess.run(CADENCE + argv, capture_output=True, text=True, timeout=60)
        assert done.returncode == 2, (name, done.stderr)
        assert "Traceback" not in done.stderr, (name, done.stderr)
        assert "cadence launch cannot start" in done.stderr or "bad.yaml" in done.stderr, name
        assert not (workdir / "started.marker").exists(), name


def test_config_update_of_a_bad_file_leaves_it_alone(workdir):
    before = (workdir / "bad.yaml").read_bytes()
    done = subprocess.run(
        CADENCE + ["config", "update", "--config_file", "bad.yaml"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1 and "not valid YAML" in done.stderr
    assert "Traceback" not in done.stderr
    assert (workdir / "bad.yaml").read_bytes() == before


# -- fuzzing the config loader -------------------------------------------------------------------------
SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-3, max_value=70_000)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=10)
)
ANYTHING = st.recursive(
    SCALARS,
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(st.text(max_size=8) | st.integers(0, 9), inner, max_size=3)
    ),
    max_leaves=6,
)
SECTION_KEYS = {
    "fsdp_config": [
        "fsdp_version",
        "version",
        "fsdp_sharding_strategy",
        "fsdp_min_num_params",
        "fsdp_offload_params",
        "fsdp_auto_wrap_policy",
        "fsdp_cpu_ram_efficient_loading",
    ],
    "deepspeed_config": [
        "zero_stage",
        "offload_optimizer_device",
        "gradient_clipping",
        "deepspeed_config_file",
        "zero3_init_flag",
    ],
    "dynamo_config": ["dynamo_backend", "dynamo_mode", "dynamo_use_fullgraph", "backend"],
}
SECTION_VALUES = (
    st.sampled_from(
        ["1", 2, "FULL_SHARD", "cpu", "INDUCTOR", "eager", "default", True, "true", 1.0]
    )
    | ANYTHING
)
PLAUSIBLE = {
    "compute_environment": st.sampled_from(["LOCAL_MACHINE"] * 6 + ["AMAZON_SAGEMAKER", "CLOUD"]),
    "distributed_type": st.sampled_from(
        [*CLUSTER_DISTRIBUTED_TYPES, "TPU", "DATA_PARALLEL", "WARP", False]
    ),
    "mixed_precision": st.sampled_from(["no", "fp16", "BF16", "fp8", "fp32", False, None]),
    "num_processes": st.integers(-2, 4),
    "num_machines": st.integers(-1, 3),
    "machine_rank": st.integers(-1, 3),
    "main_process_port": st.sampled_from([0, 29_500, -1, 70_000, None]),
    "main_process_ip": st.sampled_from(["127.0.0.1", "10.0.0.1", "", None]),
    "use_cpu": st.booleans(),
    "debug": st.booleans(),
    "gpu_ids": st.sampled_from(["all", "0,1", 0, "x", None]),
    "rdzv_backend": st.sampled_from(["static", "c10d", "zzz"]),
    "same_network": st.booleans(),
    "downcast_bf16": st.sampled_from(["no", False, True]),
    "fp16": st.booleans(),
    "dynamo_backend": st.sampled_from(["NO", "EAGER", "warp"]),
    **{
        section: st.dictionaries(st.sampled_from(keys), SECTION_VALUES, max_size=3)
        for section, keys in SECTION_KEYS.items()
    },
}


def mostly(plausible):
    """Plausible values ten times in eleven, anything at all otherwise (so loading gets past the checks)."""
    return st.sampled_from([False] * 10 + [True]).flatmap(
        lambda junk: ANYTHING if junk else plausible
    )


CONFIG_MAPPINGS = st.builds(
    lambda known, extra: {**extra, **known},
    st.fixed_dictionaries(
        {"distributed_type": mostly(PLAUSIBLE["distributed_type"])},
        optional={
            key: mostly(value) for key, value in PLAUSIBLE.items() if key != "distributed_type"
        },
    ),
    st.sampled_from([False] * 5 + [True]).flatmap(
        lambda extra: (
            st.just({})
            if not extra
            else st.dictionaries(
                st.text(max_size=8) | st.integers(0, 3) | st.none(), ANYTHING, max_size=2
            )
        ),
    ),
)


@FUZZ_SETTINGS
@given(raw=CONFIG_MAPPINGS, gpus=st.sampled_from([0, 2]))
def test_fuzz_config_mappings_load_or_fail_cleanly_and_plan_or_fail_cleanly(raw, gpus, workdir):
    try:
        loaded = config_from_dict(raw, where="fuzz.yaml")
    except ConfigFileError as error:
        event("config refused")
        assert "fuzz.yaml" in str(error)
        return
    assert isinstance(loaded, (ClusterConfig, SageMakerConfig))
    if not isinstance(loaded, ClusterConfig):
        return
    # Whatever the loader accepts, the launch planner turns into a plan or a LaunchPlanError.
    path = workdir / "fuzz.yaml"
    path.write_text(yaml.safe_dump(raw, allow_unicode=True), encoding="utf-8")
    try:
        plan = plan_for(["--config_file", str(path), "train.py"], gpus=gpus)
    except LaunchPlanError as error:
        event("config loaded, plan refused")
        assert "cadence launch cannot start" in str(error) or str(path) in str(error)
        return
    event("planned")
    assert plan.num_processes >= 1 and plan.nproc_per_node >= 1
    json.dumps(plan.record)  # the workers' settings record must serialise


DOCUMENTS = st.one_of(
    st.text(max_size=60),
    st.binary(max_size=40),
    CONFIG_MAPPINGS.map(lambda data: yaml.safe_dump(data, allow_unicode=True)),
    st.lists(
        st.sampled_from(
            [
                "distributed_type: NO",
                "num_processes: 2",
                "- x",
                "a: [",
                "? [a]\n: b",
                "!!python/object:os.system {}",
                "num_processes: &a 1\nx: *a",
                "\t",
                "fsdp_config:\n  1: 2",
            ]
        ),
        max_size=4,
    ).map("\n".join),
)


@FUZZ_SETTINGS
@given(content=DOCUMENTS, suffix=st.sampled_from([".yaml", ".json", ".yml"]))
def test_fuzz_config_documents_load_or_fail_cleanly(content, suffix, tmp_path):
    path = write(tmp_path / f"document{suffix}", content)
    try:
        loaded = load_config_from_file(path)
    except ConfigFileError as error:
        event("refused")
        assert str(path) in str(error)
        return
    event("loaded")
    assert isinstance(loaded, (ClusterConfig, SageMakerConfig))


# -- fuzzing the launch command line ------------------------------------------------------------------
# flag -> (values that make sense, values that do not)
FLAG_VALUES = {
    "--num_processes": (["1", "2"], ["0", "-1", "x", ""]),
    "--num_machines": (["1"], ["2", "0"]),
    "--machine_rank": (["0"], ["1", "-1"]),
    "--main_process_port": (["0"], ["70000", "x", "-5"]),
    "--main_process_ip": (["127.0.0.1"], ["10.1.2.3", ""]),
    "--mixed_precision": (["no", "fp16", "BF16"], ["fp32"]),
    "--dynamo_backend": (["inductor", "no"], ["warp"]),
    "--dynamo_mode": (["default"], ["fast"]),
    "--gpu_ids": (["all", "0,1"], ["a", "0;1"]),
    "--tee": (["0", "3", "0:3,1:0"], ["5", "x"]),
    "--rdzv_backend": (["static", "c10d"], ["zzz"]),
    "--rdzv_conf": (["timeout=9", ""], ["abc"]),
    "--max_restarts": (["0", "2"], ["-1"]),
    "--monitor_interval": (["0.1"], ["0", "nan", "-1", "inf"]),
    "--num_cpu_threads_per_process": (["1"], ["0"]),
    "--gradient_accumulation_steps": (["1", "4"], ["0", "x"]),
    "--zero_stage": (["0", "3"], ["7"]),
    "--fsdp_version": (["1", "2"], ["3"]),
    "--fsdp_sharding_strategy": (["FULL_SHARD", "1"], ["bad"]),
    "--fsdp_offload_params": (["true", "false"], ["maybe"]),
    "--fsdp_cpu_ram_efficient_loading": (["true", "false"], []),
    "--fsdp_sync_module_states": (["true", "false"], []),
    "--offload_param_device": (["cpu"], ["disk"]),
    "--deepspeed_config_file": (["good.yaml"], ["missing.json"]),
    "--config_file": (["good.yaml"], ["bad.yaml", "missing.yaml"]),
    "--log_dir": (["logs"], ["train.py"]),
    "--role": (["trainer"], []),
    "--main_training_function": (["main"], []),
}
SWITCHES = [
    "--cpu", "--multi_gpu", "--use_fsdp", "--use_deepspeed", "-m", "--module", "--no_python", "--quiet",
    "--debug", "--same_network", "--dynamo_use_fullgraph", "--enable_cpu_affinity", "-q",
]  # fmt: skip
UNKNOWN = ["--bogus", "--tpu", "--fp8_backend", "--num_proc", "-x", "--aws_region"]
TARGETS = ["missing.py", "--", "pkg.module", "train.py"]


def _spelled(flag: str, hyphens: bool) -> str:
    return "--" + flag[2:].replace("_", "-") if hyphens else flag


def _option(flag: str):
    good, bad = FLAG_VALUES[flag]
    values = st.sampled_from([False] * 4 + [True]).flatmap(
        lambda wrong: st.sampled_from(bad if wrong and bad else good)
    )

    def tokens(value: str, hyphens: bool, joined: bool) -> list[str]:
        name = _spelled(flag, hyphens)
        return [f"{name}={value}"] if joined else [name, value]

    return st.builds(tokens, values, st.booleans(), st.booleans())


OPTIONS = st.one_of(
    *[_option(flag) for flag in FLAG_VALUES],
    st.builds(lambda s, h: [_spelled(s, h)], st.sampled_from(SWITCHES), st.booleans()),
)
STRAY = st.sampled_from(UNKNOWN + TARGETS).map(lambda token: [token])
COMMAND_LINES = st.builds(
    lambda groups, target, tail: [t for g in groups for t in g] + target + tail,
    st.lists(
        st.sampled_from([False] * 8 + [True]).flatmap(lambda s: STRAY if s else OPTIONS), max_size=6
    ),
    st.sampled_from([["train.py"]] * 5 + [[]]),
    st.lists(
        st.sampled_from(["--lr", "3", "--num_processes", "-x"]), max_size=3
    ),  # the script's own
)


def run_in_process(argv: list[str]) -> tuple[int, str, str]:
    """`cadence launch --dry_run <argv>` in this process: exit code, stdout, stderr."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = cadence_main(["launch", "--dry_run", *argv])
        except SystemExit as stop:  # argparse usage errors
            code = stop.code
    return code, out.getvalue(), err.getvalue()


@FUZZ_SETTINGS
@given(argv=COMMAND_LINES)
def test_fuzz_launch_command_lines_plan_or_exit_2(argv, workdir):
    code, out, err = run_in_process(argv)
    assert "Traceback" not in err and "Traceback" not in out, (argv, err)
    assert code in (0, 2), (argv, code, err)
    if code == 0:
        event("planned")
        assert "worker command:" in out
    else:
        event("refused")
        assert err.strip(), argv  # a usage error always says something
    assert not (workdir / "started.marker").exists()
