# Two entry points for a newcomer: `make run` and `make test`. Each creates .venv when
# it is missing and installs the project into it (again whenever pyproject.toml changes).
PYTHON ?= python3
VENV   ?= .venv
STAMP  := $(VENV)/.installed-stamp
HYPOTHESIS_PROFILE ?= ci
# test processes: one more than the cores (pytest-xdist), as a test often waits on its
# servers (nats-server, `pulse up`, a CLI run) and a spare process keeps the cores busy
# meanwhile (here, 2 cores: 166% CPU with two, 188% with three). Each takes a contiguous
# share of the tests in file order and, once done, takes half of what another has left
# (worksteal): the processes end together however unequal the files, and a file's tests
# stay together (its module-wide servers start once) except where work is handed over.
TEST_WORKERS ?= $(shell echo $$(( $$(nproc) + 1 )))
export HYPOTHESIS_PROFILE
# Python caches compiled modules in __pycache__ unless PYTHONDONTWRITEBYTECODE is set (as
# it is on some machines and CI images): then every process (each test worker, each
# `pulse` command, `pulse up` and its SQL workers) compiles Pulse's modules again, and
# pytest rewrites every test module again in each worker. The suite starts hundreds of
# such processes, so it keeps the cache.
unexport PYTHONDONTWRITEBYTECODE

.PHONY: run test test-cpu lint bench bench-quick bench-edges bench-scale clean

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "Pulse needs Python 3.11 or newer; set PYTHON=python3.x")'
	test -x $(VENV)/bin/python || $(PYTHON) -m venv $(VENV)
	$(VENV)/bin/python -m pip install --quiet --upgrade pip
	$(VENV)/bin/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

# the generated-clients test's TypeScript tools (tests/clients: openapi-typescript,
# openapi-fetch, typescript), installed from their lock file
NODE_STAMP := tests/clients/node_modules/.package-lock.json
$(NODE_STAMP): tests/clients/package-lock.json
	cd tests/clients && npm ci --no-audit --no-fund --loglevel=error
	touch $(NODE_STAMP)

# the console's browser tests (tests/test_console.py) drive Debian's Chromium; installed
# once when the machine lacks it (as root, or with sudo). CHROMIUM=/path uses another.
CHROMIUM ?= /usr/bin/chromium
export CHROMIUM
$(CHROMIUM):
	@command -v apt-get >/dev/null || { echo "the console's tests need Chromium: install it, or set CHROMIUM=/path/to/chromium"; exit 1; }
	$(if $(filter 0,$(shell id -u)),,sudo) sh -c 'apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium'

run: $(STAMP)
	$(VENV)/bin/pulse up

test: $(STAMP) $(NODE_STAMP) $(CHROMIUM)
	$(VENV)/bin/python -m pytest -n $(TEST_WORKERS) --dist worksteal $(PYTEST_ARGS)

# CPU seconds per test and per file, its servers included, in one process (the suite is
# CPU-bound: `make test` takes about total / cores); e.g. FILES=tests/test_as_of.py
test-cpu: $(STAMP)
	$(VENV)/bin/python -m pytest -p no:xdist -p tests.cpu_time $(FILES) $(PYTEST_ARGS)

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

bench: $(STAMP) $(CHROMIUM)
	$(VENV)/bin/python -m ops.bench.log_throughput
	$(VENV)/bin/python -m ops.bench.projection
	$(VENV)/bin/python -m ops.bench.sync
	$(VENV)/bin/python -m ops.bench.service
	$(VENV)/bin/python -m ops.bench.engine
	$(VENV)/bin/python -m ops.bench.as_of
	$(VENV)/bin/python -m ops.bench.following
	$(VENV)/bin/python -m ops.bench.sealing
	$(VENV)/bin/python -m ops.bench.snapshot
	$(VENV)/bin/python -m ops.bench.cli_start
	$(VENV)/bin/python -m ops.bench.languages
	$(VENV)/bin/python -m ops.bench.langgraph
	$(VENV)/bin/python -m ops.bench.console
	$(VENV)/bin/python -m ops.bench.recall
	$(VENV)/bin/python -m ops.bench.duplicates
	$(VENV)/bin/python -m ops.bench.durability
	$(VENV)/bin/python -m ops.bench.hosts
	$(VENV)/bin/python -m ops.bench.subjects
	$(MAKE) bench-edges

# issue 28's key ratios (write tail, HTTP tax, writes against the raw log) in under 45 s,
# compared with ops/bench/baseline.json: lists every figure more than 15% worse;
# QUICK_ARGS=--strict fails on one (see docs/benchmarks.md)
bench-quick: $(STAMP)
	$(VENV)/bin/python -m ops.bench.quick $(QUICK_ARGS)

# issue 28's targets 1 and 2 (write tail, HTTP tax) beside Postgres+pgvector, which the
# bench extra brings (EDGES_ARGS=--size 0.1 for a quick run; see docs/benchmarks.md)
bench-edges: $(STAMP)
	$(VENV)/bin/python -m pip install --quiet -e '.[bench]'
	$(VENV)/bin/python -m ops.bench.edges $(EDGES_ARGS)

# issue 28 target 4: a million memories on one host, beside FAISS alone (estimated at
# 80-95 minutes on 2 cores and 12 GB of temporary disk at full size: see
# docs/benchmarks.md); SCALE_ARGS="--size 0.05" for 50,000
bench-scale: $(STAMP)
	$(VENV)/bin/python -m ops.bench.scale $(SCALE_ARGS)

clean:
	rm -rf $(VENV) .pulse .pytest_cache .hypothesis tests/clients/node_modules site
