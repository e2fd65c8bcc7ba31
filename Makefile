# retry-fsm: every target does its own set-up (virtualenv, packages, Graphviz `dot`).
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: setup .dot .redis .node demo test diagrams diagrams-diff bench clean

setup: $(STAMP) .dot .redis

$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	@touch $(STAMP)

# Graphviz's `dot` renders the SVG diagrams; install it through the system package manager.
.dot:
	@command -v dot >/dev/null 2>&1 || { \
	  echo "installing Graphviz (dot)"; \
	  if command -v apt-get >/dev/null 2>&1; then \
	    $(SUDO) apt-get update -qq && $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq graphviz >/dev/null; \
	  elif command -v dnf >/dev/null 2>&1; then $(SUDO) dnf install -y graphviz; \
	  elif command -v brew >/dev/null 2>&1; then brew install graphviz; \
	  else echo "please install Graphviz (the dot binary)" >&2; exit 1; fi; }
	@command -v dot >/dev/null 2>&1

# Node.js runs pi's own RPC client in tests/conformance (the client itself is installed from the
# npm registry into ~/.cache/retry-fsm/npm by the test set-up, outside the checkout).
.node:
	@{ command -v node && command -v npm; } >/dev/null 2>&1 || { \
	  echo "installing Node.js (node, npm)"; \
	  if command -v apt-get >/dev/null 2>&1; then \
	    $(SUDO) apt-get update -qq && $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nodejs npm >/dev/null; \
	  elif command -v dnf >/dev/null 2>&1; then $(SUDO) dnf install -y nodejs npm; \
	  elif command -v brew >/dev/null 2>&1; then brew install node; \
	  else echo "please install Node.js (node and npm)" >&2; exit 1; fi; }
	@command -v node >/dev/null 2>&1 && command -v npm >/dev/null 2>&1

# The fleet tests and benchmarks start their own throw-away `redis-server` (no persistence, a
# free loopback port); install the server binary through the system package manager.
.redis:
	@command -v redis-server >/dev/null 2>&1 || { \
	  echo "installing redis-server"; \
	  if command -v apt-get >/dev/null 2>&1; then \
	    $(SUDO) apt-get update -qq && $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server >/dev/null; \
	  elif command -v dnf >/dev/null 2>&1; then $(SUDO) dnf install -y redis; \
	  elif command -v brew >/dev/null 2>&1; then brew install redis; \
	  else echo "please install Redis (the redis-server binary)" >&2; exit 1; fi; }
	@command -v redis-server >/dev/null 2>&1

demo: setup
	$(PY) -m fsm demo

# COVERAGE_FILE is absolute so that the subprocesses the tests start (rpc, chat, demo, classify)
# write their coverage data next to ours, whatever their working folder.
# The transition coverage of the run is then drawn (build/transition-coverage.svg, per state:
# -states.svg) and written as Markdown (build/transition-coverage.md), whatever the tests'
# outcome; pytest's status wins.
test: setup .node
	@mkdir -p build
	@status=0; COVERAGE_FILE=$(CURDIR)/build/.coverage $(PY) -m pytest -q -n 2 --cov=fsm --cov-branch --cov-report=term --cov-fail-under=95 \
	  --transition-coverage --transition-coverage-fail-under=100 \
	  --transition-coverage-report=build/transition-coverage.json || status=$$?; \
	$(PY) -m fsm audit build/transition-coverage.json --svg build/transition-coverage.svg \
	  --svg-states build/transition-coverage-states.svg --md build/transition-coverage.md \
	  > build/transition-coverage.txt \
	  && echo "transition coverage: build/transition-coverage.svg (picture), build/transition-coverage.md (report)"; \
	exit $$status

diagrams: setup
	$(PY) -m fsm diagrams --out diagrams

# The changes to the machine since BASE (a git revision), for a pull request: build/diagrams-diff/
BASE ?= main
diagrams-diff: setup
	$(PY) -m fsm diagrams --diff-ref $(BASE) --out build/diagrams-diff

bench: setup
	$(PY) benchmarks/run.py

clean:
	rm -rf build .coverage .coverage.*
