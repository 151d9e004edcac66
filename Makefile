# Two commands do all the set-up: `make demo` and `make test`.
# Each creates .venv and installs what it needs (llama-cpp-python compiles from
# source the first time, about 5 minutes on 2 cores; pip caches the wheel).

PYTHON ?= python3

# llama.cpp is compiled for a portable x86-64 (AVX2, FMA, F16C), not for the CPU that builds
# it (-march=native, llama.cpp's default): on a Xeon with AVX-512 and AMX, llama-cpp-python
# 0.3.36 built natively dies (SIGSEGV) in its first decode. Set CMAKE_ARGS to build otherwise.
# A wheel pip cached from an earlier build is used as it is: `pip cache remove llama_cpp_python`.
ifeq ($(shell uname -m),x86_64)
export CMAKE_ARGS ?= -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON
endif
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

# The demo's two files only: each examples/<feature>/ folder says how to run it.
demo: export CORRAL_HOME ?= $(CURDIR)/.corral-demo
# the example's tool program, shown to its sandbox even from a private (0700) directory
demo: export CORRAL_SANDBOX_ALLOWED_PATHS ?= $(CURDIR)/examples/tools
demo: $(STAMP)
	$(BIN)/corral apply -f examples/assistant.yaml -f examples/wasm-tools.yaml
	$(BIN)/corral run assistant "What is 17 plus 25? Use the add tool."

# lint-imports: the import contracts in pyproject.toml ([tool.importlinter]): layers, no cycles
lint: $(STAMP)
	$(BIN)/ruff check src tests bench
	$(BIN)/ruff format --check src tests bench
	$(BIN)/lint-imports

typecheck: $(STAMP)
	$(BIN)/mypy

# pytest-xdist: a test process per core, with work stealing, so that the longest tests do not
# end the run alone. TEST_WORKERS=N to choose: one more than the cores is faster (the suite
# waits on subprocesses and servers more than it computes) but made timing-bound tests (pty
# chats, a NATS restart) miss their deadlines on a 2-core machine.
TEST_WORKERS ?= $(shell nproc)
unit: $(STAMP)
	$(BIN)/pytest -q -n $(TEST_WORKERS) --dist worksteal

test: lint typecheck unit

# The benchmark suite runs in a venv of its own, bench/.venv (Corral from this tree plus the
# pinned peer frameworks), so the peers never enter Corral's dependencies. Tables go to
# stdout and docs/benchmarks.md is rewritten from the run; BENCH_ARGS passes options to
# bench/run.py (e.g. BENCH_ARGS="--note 'The machine was shared.'").
BENCH_VENV  := bench/.venv
BENCH_STAMP := $(BENCH_VENV)/.installed

$(BENCH_STAMP): bench/requirements.txt pyproject.toml
	$(PYTHON) -m venv $(BENCH_VENV)
	$(BENCH_VENV)/bin/python -m pip install --quiet --upgrade pip
	cd bench && .venv/bin/python -m pip install --quiet -r requirements.txt
	touch $(BENCH_STAMP)

bench: $(BENCH_STAMP)
	$(BENCH_VENV)/bin/python bench/run.py --write-docs $(BENCH_ARGS)

clean:
	rm -rf $(VENV) .corral-demo .mypy_cache .ruff_cache .pytest_cache .import_linter_cache
