# `make demo` and `make test` work on a fresh machine with only Python 3.11.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
PY := $(VENV)/bin/python
DEMO_STAMP := $(VENV)/.cadence-demo-installed
STAMP := $(VENV)/.cadence-installed

.PHONY: demo test test-xla test-torch test-exit lint format bench docs docs-screenshots campaign

# The demo needs only torch and the package; the suite adds the test tools, the optional packages
# whose integrations it exercises (trackers, DeepSpeed, transformers & co., Ray) and the documentation
# tools. peft and TRL pull the reference library in as a dependency: it is removed again, so that the
# suite runs the `accelerate` alias as a user without the reference has it (and never the reference).
$(DEMO_STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q torch==2.13.0 -e .
	touch $(DEMO_STAMP)

$(STAMP): $(DEMO_STAMP)
	$(PY) -m pip install -q torch==2.13.0 -e '.[test,trackers,deepspeed,docs,ft]'
	$(PY) -m pip uninstall -q -y accelerate
	touch $(STAMP)

demo: $(DEMO_STAMP)
	$(VENV)/bin/cadence launch --cpu --num_processes 2 examples/train_regression.py

# Two test processes (pytest-xdist): most tests wait on the processes they start, so two of them keep
# both cores busy and the suite within its time on a 2-core machine.
test: $(STAMP)
	$(PY) -m pytest -q -n 2 --dist loadfile --durations=15 tests

# The randomized fault campaign of fault tolerance (tests/ft_campaign.py): each run prints its seed and
# scenario on one line; SEED=S replays one, N draws that many (a failing seed becomes a case of
# tests/test_fault_campaign.py); ELASTIC=1 drives the elastic launcher (two local nodes) instead.
# Failed runs' folders are kept and named.
SEED ?=
N ?= 20
ELASTIC ?=
campaign: $(STAMP)
	$(PY) tests/ft_campaign.py $(if $(SEED),--seed $(SEED),--runs $(N)) $(if $(ELASTIC),--elastic) --keep

# The documentation site (mkdocs.yml, docs/) into site/; --strict fails on a broken link or reference.
# `.venv/bin/mkdocs serve` serves it locally. The variables silence two banners printed by the theme and a plugin.
docs: $(STAMP)
	DISABLE_MKDOCS_2_WARNING=true NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict

# Screenshots of the Accelerator's section of the built API reference in headless Chromium, in tiles of
# one screen (site-screenshots/cadence.Accelerator-NN.png), to check that parameters and examples
# render. Needs Chromium (`apt-get install chromium`, or CHROMIUM=/path/to/it); NAME= picks another object.
NAME ?= cadence.Accelerator
docs-screenshots: docs
	$(PY) docs/screenshots.py --site site --out site-screenshots --name $(NAME)

# Optional: the XLA path on torch_xla's CPU device, in its own venv (torch_xla pins torch 2.9, whose
# only reachable wheel is the CUDA build: ~7 GB, several minutes the first time). `make test` skips these.
XLA_VENV := .venv-xla
XLA_PY := $(XLA_VENV)/bin/python
XLA_STAMP := $(XLA_VENV)/.cadence-installed

$(XLA_STAMP): pyproject.toml
	test -x $(XLA_PY) || $(PYTHON) -m venv $(XLA_VENV)
	$(XLA_PY) -m pip install -q torch==2.9.0 torch-xla==2.9.0
	$(XLA_PY) -m pip install -q numpy pyyaml safetensors packaging pytest hypothesis tqdm xxhash
	$(XLA_PY) -m pip install -q --no-deps -e .
	touch $(XLA_STAMP)

test-xla: $(XLA_STAMP)
	PJRT_DEVICE=CPU $(XLA_PY) -m pytest -q -m xla tests/xla

# Optional: one declared torch version (pyproject: torch>=2.6) in its own venv, from the registry's
# default wheel (a CUDA build with its nvidia packages; it runs on CPU): the package's dependencies,
# the test tools of the core subset, the demo and that subset (launch, elastic, checkpoint, data, FSDP,
# supervision). `make test-torch TORCH=2.7.1`; docs/supported-versions.md holds the results.
TORCH ?=
TORCH_VENV := .venv-torch-$(TORCH)
TORCH_PY := $(TORCH_VENV)/bin/python
TORCH_STAMP := $(TORCH_VENV)/.cadence-installed
CORE_TESTS := tests/test_torch_compat.py tests/test_cli_launch_run.py tests/test_cli_launch_plan.py \
	tests/test_cli_multi_machine.py tests/test_launchers.py tests/test_launch_bounds.py \
	tests/test_launch_world_check.py tests/test_torchrun.py tests/test_rendezvous_leave.py \
	tests/test_store_security.py tests/test_elastic_launch.py tests/test_elastic_resume.py \
	tests/test_elastic_checkpoint.py tests/test_elastic_fsdp.py $(wildcard tests/test_checkpoint_*.py) \
	$(wildcard tests/test_data_*.py) tests/test_fsdp.py tests/test_fsdp1.py tests/test_supervision.py \
	tests/test_process_control.py tests/test_resume_after_kill.py tests/test_diagnostics_jobs.py \
	tests/test_clean_exit.py

$(TORCH_STAMP): pyproject.toml
	@test -n "$(TORCH)" || { echo "usage: make test-torch TORCH=2.7.1"; exit 2; }
	test -x $(TORCH_PY) || $(PYTHON) -m venv $(TORCH_VENV)
	$(TORCH_PY) -m pip install -q torch==$(TORCH) numpy pyyaml safetensors packaging xxhash \
		pytest pytest-xdist hypothesis nbformat nbclient ipykernel
	$(TORCH_PY) -m pip install -q --no-deps -e .
	touch $(TORCH_STAMP)

test-torch: $(TORCH_STAMP)
	$(TORCH_VENV)/bin/cadence launch --cpu --num_processes 2 examples/train_regression.py
	$(TORCH_PY) -m pytest -q -n 2 --dist loadfile $(CORE_TESTS)

# The long form of the clean-exit check: the demo's script, 30 launches under CPU load, each must exit 0
# (the suite runs one). A lean install, as a user of the demo has it: torch, the package and pytest.
LEAN_VENV := .venv-lean
LEAN_STAMP := $(LEAN_VENV)/.cadence-installed
$(LEAN_STAMP): pyproject.toml
	test -x $(LEAN_VENV)/bin/python || $(PYTHON) -m venv $(LEAN_VENV)
	$(LEAN_VENV)/bin/python -m pip install -q torch==2.13.0 pytest -e .
	touch $(LEAN_STAMP)

test-exit: $(LEAN_STAMP)
	CADENCE_EXIT_RUNS=30 $(LEAN_VENV)/bin/python -m pytest -q -p no:cacheprovider tests/test_clean_exit.py

lint: $(STAMP)
	$(VENV)/bin/ruff check src tests examples benchmarks compat docs/*.py
	$(VENV)/bin/ruff format --check src tests examples benchmarks compat docs/*.py
	$(PY) -m pytest -q tests/test_layers.py   # the declared layers (ARCHITECTURE.md)

format: $(STAMP)
	$(VENV)/bin/ruff format src tests examples benchmarks compat docs/*.py
	$(VENV)/bin/ruff check --fix src tests examples benchmarks compat docs/*.py

# The benchmarks that run on a CPU-only machine, in small sizes (a few minutes in all). REF_PY, the
# python of a venv with the reference library, adds the reference's numbers where a benchmark compares:
#   make bench REF_PY=/path/to/reference-venv/bin/python
# GPU, FSDP and XLA benchmarks (bench_gpu.py, bench_fsdp.py, bench_xla_step.py) run by hand.
REF_PY ?=
bench: $(STAMP)
	$(PY) benchmarks/bench_import.py --runs 7 $(if $(REF_PY),--reference-python $(REF_PY))
	$(PY) benchmarks/bench_cli.py --rounds 2 --help_rounds 5
	$(PY) benchmarks/bench_training_step.py --rounds 3
	$(PY) benchmarks/bench_autocast_step.py --rounds 3 --steps 500
	$(PY) benchmarks/bench_ledger.py --rounds 3 --steps 100
	$(PY) benchmarks/bench_dataloader.py --rounds 3 --samples 50000
	$(PY) benchmarks/bench_collectives.py
	$(PY) benchmarks/bench_checkpoint.py --params 10 --rounds 1 --procs 1 --reference $(if $(REF_PY),$(REF_PY),none)
	$(PY) benchmarks/bench_reshard_load.py --params 4 --rounds 1 --loads 1
	$(if $(REF_PY),$(PY) benchmarks/bench_big_model.py --size-mb 64 --rounds 1 --reference-python $(REF_PY),@echo "bench_big_model.py compares with the reference: skipped without REF_PY")
