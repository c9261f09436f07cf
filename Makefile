# Two entry points that work on a fresh machine with only python3:
#   make demo   build and verify a model for built-in data (core install only)
#   make test   the whole test suite (installs the test, torch, plotting and lens extras)
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: demo test lint bench

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

$(VENV)/.core: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -q -e .
	touch $@

$(VENV)/.full: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -q -e ".[dev,torch,plot,examples,lens]"
	touch $@ $(VENV)/.core

demo: $(VENV)/.core
	$(BIN)/exactformer demo

test: $(VENV)/.full
	$(BIN)/python -m ruff check .
	$(BIN)/python -m pytest

bench: $(VENV)/.full
	$(BIN)/python benchmarks/bench_build.py
