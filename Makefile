# retry-fsm: every target does its own set-up, and says what it installs and why before it
# installs it: uv (in .uv/, with pip), the virtualenv .venv from uv.lock, and the system
# programs the tests drive (Graphviz `dot`, `redis-server`, Node.js, Chromium and the DejaVu
# fonts).
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
# uv: the one on PATH, else a private copy in .uv/ (installed with pip on first use).
UV ?= $(shell command -v uv 2>/dev/null || echo $(CURDIR)/.uv/bin/uv)

.PHONY: setup .dot .redis .node .browser demo test test-locked test-lowest typecheck dist docs diagrams \
	diagrams-diff bench clean

setup: $(STAMP) .dot .redis .browser

# A system package through whatever package manager the machine has; $(1) apt name, $(2) dnf
# name, $(3) Homebrew name. The caller has already said what it installs and why.
define system_install
if command -v apt-get >/dev/null 2>&1; then \
  $(SUDO) apt-get update && $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends $(1); \
elif command -v dnf >/dev/null 2>&1; then $(SUDO) dnf install -y $(2); \
elif command -v brew >/dev/null 2>&1; then brew install $(3); \
else echo "no apt-get, dnf or brew here: please install $(1) yourself" >&2; exit 1; fi
endef

$(UV):
	@echo "installing uv into .uv/ with pip: it creates the virtualenv from uv.lock (the locked versions)"
	$(PYTHON) -m venv .uv
	.uv/bin/python -m pip install --disable-pip-version-check uv

# The virtualenv: the library with every extra and the dev tools, at the versions of uv.lock.
# Compiled to bytecode at install: the tests start a few hundred Python processes, and where
# PYTHONDONTWRITEBYTECODE is set (many container images) each would otherwise compile the SDKs
# it imports from source again (twice the CPU of a `python -m fsm rpc` start).
$(STAMP): pyproject.toml uv.lock | $(UV)
	@echo "installing the locked packages into $(VENV) (uv sync --frozen --all-extras --compile-bytecode): the library, every extra and the test tools"
	UV_PROJECT_ENVIRONMENT=$(VENV) $(UV) sync --frozen --all-extras --compile-bytecode --python $(PYTHON)
	@touch $(STAMP)

# Graphviz's `dot` renders the SVG diagrams (make diagrams, the transition-coverage picture).
.dot:
	@command -v dot >/dev/null 2>&1 || { \
	  echo "installing Graphviz (system package): its dot program draws the SVG diagrams and the transition-coverage picture"; \
	  $(call system_install,graphviz,graphviz,graphviz); }
	@command -v dot >/dev/null 2>&1

# The browser test opens the HTML transition-coverage report in the distribution's Chromium
# (/usr/bin/chromium, headless, background networking off; never a downloaded browser build)
# and measures its diagram; the diagrams name the DejaVu Sans font, so Graphviz and the browser
# measure the labels alike.
.browser:
	@{ [ -x /usr/bin/chromium ] && fc-list 2>/dev/null | grep -q "DejaVu Sans"; } || { \
	  echo "installing chromium and fonts-dejavu-core (system packages): the browser test opens the HTML coverage report in Chromium, and the diagrams' labels are drawn and measured in DejaVu Sans"; \
	  $(call system_install,chromium fonts-dejavu-core,chromium dejavu-sans-fonts,chromium font-dejavu); }
	@[ -x /usr/bin/chromium ] || command -v chromium >/dev/null 2>&1

# Node.js runs pi's own RPC client in tests/conformance (the client itself is installed from the
# npm registry into ~/.cache/retry-fsm/npm by the test set-up, outside the checkout).
.node:
	@{ command -v node && command -v npm; } >/dev/null 2>&1 || { \
	  echo "installing Node.js and npm (system packages): the conformance tests run pi's own RPC client against our server"; \
	  $(call system_install,nodejs npm,nodejs npm,node); }
	@command -v node >/dev/null 2>&1 && command -v npm >/dev/null 2>&1

# The fleet tests and benchmarks start their own throw-away `redis-server` (no persistence, a
# free loopback port), and a three-master Redis Cluster joined by `redis-cli --cluster create`.
.redis:
	@{ command -v redis-server && command -v redis-cli; } >/dev/null 2>&1 || { \
	  echo "installing redis-server and redis-cli (system package): the fleet tests start their own throw-away Redis and Redis Cluster on free loopback ports"; \
	  $(call system_install,redis-server redis-tools,redis,redis); }
	@command -v redis-server >/dev/null 2>&1 && command -v redis-cli >/dev/null 2>&1

# The demo needs the virtualenv only (the openai SDK and the fault server are in it).
demo: $(STAMP)
	$(PY) -m fsm demo

# Everything CI checks (bash .ci/run): the suite on the locked versions with its coverage gates,
# the core/runner/SDK tests on the lowest versions the metadata allows, the strict type check of
# fsm/core, the wheel and sdist, and the documentation site. Each step runs whatever the others' outcome; the first
# failure's status is the target's.
test: setup .node
	@status=0; \
	echo "== 1/5 the suite on the locked versions (uv.lock)"; \
	$(MAKE) --no-print-directory test-locked || status=$$?; \
	echo "== 2/5 core, runner and SDK providers on the lowest versions pyproject.toml allows"; \
	$(MAKE) --no-print-directory test-lowest || { [ $$status != 0 ] || status=$$?; }; \
	echo "== 3/5 strict type check of fsm/core (mypy --strict)"; \
	$(MAKE) --no-print-directory typecheck || { [ $$status != 0 ] || status=$$?; }; \
	echo "== 4/5 the wheel and the sdist (python -m build, twine check, contents)"; \
	$(MAKE) --no-print-directory dist || { [ $$status != 0 ] || status=$$?; }; \
	echo "== 5/5 the documentation site (Sphinx + MyST + autodoc, nitpicky, warnings as errors)"; \
	$(MAKE) --no-print-directory docs || { [ $$status != 0 ] || status=$$?; }; \
	exit $$status

# COVERAGE_FILE is absolute so that the subprocesses the tests start (rpc, chat, demo, classify)
# write their coverage data next to ours, whatever their working folder.
# The transition coverage of the run is written as the HTML report a reviewer opens
# (build/transition-coverage-html/index.html: every row with the tests that took it), then
# drawn (build/transition-coverage.svg, per state: -states/) and written as Markdown
# (build/transition-coverage.md), whatever the tests' outcome; pytest's status wins.
# fsm/ is compiled to bytecode first, for the same reason as the virtualenv (the files are
# ignored by git).
test-locked: setup .node
	@mkdir -p build
	@$(PY) -m compileall -q fsm
	@status=0; COVERAGE_FILE=$(CURDIR)/build/.coverage $(PY) -m pytest -q -n 2 --cov=fsm --cov-branch --cov-report=term --cov-fail-under=94 \
	  --transition-coverage --transition-coverage-fail-under=100 \
	  --transition-coverage-report=build/transition-coverage.json \
	  --transition-coverage-html=build/transition-coverage-html || status=$$?; \
	$(PY) -m fsm audit build/transition-coverage.json --svg build/transition-coverage.svg \
	  --svg-states build/transition-coverage-states --md build/transition-coverage.md \
	  > build/transition-coverage.txt \
	  && echo "transition coverage: build/transition-coverage.svg (picture), build/transition-coverage-states/ (one per state), build/transition-coverage.md (report)"; \
	exit $$status

# A throw-away virtualenv (build/venv-lowest) with transitions, openai and anthropic at their
# lower bounds (uv's lowest-direct resolution); see .ci/lowest-direct.
test-lowest: $(STAMP)
	bash .ci/lowest-direct $(UV) $(abspath $(PY))

typecheck: $(STAMP)
	$(PY) -m mypy

dist: $(STAMP)
	@rm -rf build/dist
	$(PY) -m build --outdir build/dist
	$(PY) -m twine check --strict build/dist/*
	$(PY) .ci/check-dist build/dist

# The documentation site in build/docs/ (open build/docs/index.html): the Markdown of README and
# docs/ as it is (MyST), the API reference from the docstrings (autodoc, docs/api.md). Nitpicky:
# a reference to a name of the project that resolves nowhere is an error, as is any warning.
docs: $(STAMP)
	$(PY) -m sphinx -b html -n -W --keep-going -q -E docs build/docs
	@echo "documentation: build/docs/index.html"

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
