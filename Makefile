# Two commands do all the set-up: `make demo` and `make test`.
# Each creates .venv and installs what it needs (llama-cpp-python compiles from
# source the first time, about 5 minutes on 2 cores; pip caches the wheel).

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: demo test lint typecheck unit install clean bench

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e ".[dev,local]"
	touch $(STAMP)

install: $(STAMP)

demo: export CORRAL_HOME ?= $(CURDIR)/.corral-demo
demo: $(STAMP)
	$(BIN)/corral apply -f examples/
	$(BIN)/corral run assistant "What is 17 plus 25? Use the add tool."

lint: $(STAMP)
	$(BIN)/ruff check src tests bench
	$(BIN)/ruff format --check src tests bench

typecheck: $(STAMP)
	$(BIN)/mypy

unit: $(STAMP)
	$(BIN)/pytest -q

test: lint typecheck unit

# Figures go to stdout; docs/benchmarks.md records a run with its machine and date.
bench: $(STAMP)
	$(BIN)/python bench/durable_overhead.py
	$(BIN)/python bench/throughput.py

clean:
	rm -rf $(VENV) .corral-demo .mypy_cache .ruff_cache .pytest_cache
