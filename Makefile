# `make demo` and `make test` work on a fresh machine with only Python 3.11.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
PY := $(VENV)/bin/python
DEMO_STAMP := $(VENV)/.cadence-demo-installed
STAMP := $(VENV)/.cadence-installed

.PHONY: demo test lint format bench

# The demo needs only torch and the package; the suite adds the test tools and the optional packages
# whose integrations it exercises (trackers, DeepSpeed).
$(DEMO_STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q torch==2.13.0 -e .
	touch $(DEMO_STAMP)

$(STAMP): $(DEMO_STAMP)
	$(PY) -m pip install -q torch==2.13.0 -e '.[test,trackers,deepspeed]'
	touch $(STAMP)

demo: $(DEMO_STAMP)
	$(VENV)/bin/cadence launch --num_processes 2 examples/train_regression.py

test: $(STAMP)
	$(PY) -m pytest -q tests

lint: $(STAMP)
	$(VENV)/bin/ruff check src tests examples benchmarks
	$(VENV)/bin/ruff format --check src tests examples benchmarks
	$(PY) -m pytest -q tests/test_layers.py   # the declared layers (ARCHITECTURE.md)

format: $(STAMP)
	$(VENV)/bin/ruff format src tests examples benchmarks
	$(VENV)/bin/ruff check --fix src tests examples benchmarks
