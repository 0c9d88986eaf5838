# `make demo` and `make test` work on a fresh machine with only Python 3.11.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
PY := $(VENV)/bin/python
DEMO_STAMP := $(VENV)/.cadence-demo-installed
STAMP := $(VENV)/.cadence-installed

.PHONY: demo test test-xla lint format bench docs

# The demo needs only torch and the package; the suite adds the test tools, the optional packages
# whose integrations it exercises (trackers, DeepSpeed) and the documentation tools.
$(DEMO_STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q torch==2.13.0 -e .
	touch $(DEMO_STAMP)

$(STAMP): $(DEMO_STAMP)
	$(PY) -m pip install -q torch==2.13.0 -e '.[test,trackers,deepspeed,docs]'
	touch $(STAMP)

demo: $(DEMO_STAMP)
	$(VENV)/bin/cadence launch --cpu --num_processes 2 examples/train_regression.py

test: $(STAMP)
	$(PY) -m pytest -q tests

# The documentation site (mkdocs.yml, docs/) into site/; --strict fails on a broken link or reference.
# `.venv/bin/mkdocs serve` serves it locally. The variables silence two banners printed by the theme and a plugin.
docs: $(STAMP)
	DISABLE_MKDOCS_2_WARNING=true NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict

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

lint: $(STAMP)
	$(VENV)/bin/ruff check src tests examples benchmarks docs/*.py
	$(VENV)/bin/ruff format --check src tests examples benchmarks docs/*.py
	$(PY) -m pytest -q tests/test_layers.py   # the declared layers (ARCHITECTURE.md)

format: $(STAMP)
	$(VENV)/bin/ruff format src tests examples benchmarks docs/*.py
	$(VENV)/bin/ruff check --fix src tests examples benchmarks docs/*.py
