# mnnvl-pipelines — `make help` lists the targets.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# torch is installed before the extras so the extras' range (torch>=2.6) is already met.
# Where PyPI would serve a CUDA build, point pip at the CPU wheels, e.g.
#   make install TORCH_PIP_ARGS="--index-url https://download.pytorch.org/whl/cpu"
TORCH_SPEC ?= torch==2.13.0
TORCH_PIP_ARGS ?=
# Upstream schemas the tests validate against; fetched by `make schemas` when absent.
SCHEMA_DIR ?= $(or $(MNNVL_SCHEMA_DIR),schemas)
export MNNVL_SCHEMA_DIR := $(abspath $(SCHEMA_DIR))
SCHEMA_STAMP := $(SCHEMA_DIR)/nvidia-dra-driver/crds/resource.nvidia.com_computedomains.yaml
# The newest kubernetes client the driver supports; the main venv has the oldest (kfp's pin).
K8S_CLIENT_NEWEST ?= kubernetes>=37,<38
CLIENT_VENV ?= .venv-client-newest
# Images: `make images REGISTRY=ghcr.io/you TAG=0.2.0 [PUSH=1]` (TAG defaults to the version).
# PLATFORMS=linux/amd64,linux/arm64 adds Grace (GB200/GB300, aarch64) nodes; several platforms
# need buildx and PUSH=1 or OCI_DIR=DIR, else they stay in the build cache (docker's classic
# image store cannot load a multi-platform image). Empty: the engine's own platform.
REGISTRY ?= ghcr.io/mnnvl-pipelines
TAG ?=
PUSH ?= 0
PLATFORMS ?=
OCI_DIR ?=
# pytest workers for make test (pytest-xdist; auto = one per core; 0 = all in one process).
# Two per core, at most 8: a simulator test waits on its cluster's timers (IMEX start-up,
# grace periods, outages) about as long as it computes, so one worker per core leaves the
# cores half idle.
TEST_WORKERS ?= $(shell n=$$(nproc 2>/dev/null || echo 1); echo $$(( 2 * n < 8 ? 2 * n : 8 )))
RUN_ID ?= demo-run
NAMESPACE ?= default
NODES ?= 2
NODES_PER_CLIQUE ?= 0
GPUS_PER_NODE ?= 4
PIPELINE ?= training
WORKLOAD ?= job

.DEFAULT_GOAL := help
.PHONY: help install run test test-client-newest images lint typecheck compile check-compiled render bench test-gpu schemas clean

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-15s %s\n", $$1, $$2}'

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q $(TORCH_PIP_ARGS) "$(TORCH_SPEC)"
	$(PY) -m pip install -q -e ".[kfp,argo,runtime,dev]"
	touch $@

install: $(VENV)/.installed ## create .venv and install the package with all extras

run: install ## the whole KFP pipeline on the embedded simulated cluster (PIPELINE=training|custom, WORKLOAD=job|trainjob)
	@# The simulator checks ComputeDomains against the driver's CRD when the schemas are here;
	@# without them (a fresh machine) it keeps its built-in ComputeDomain rules.
	MNNVL_SCHEMA_DIR="$(if $(wildcard $(SCHEMA_STAMP)),$(MNNVL_SCHEMA_DIR),)" \
	$(PY) -m mnnvl.pipelines.local_run --pipeline $(PIPELINE) --workload $(WORKLOAD) --nodes $(NODES) --nodes-per-clique $(NODES_PER_CLIQUE)

test: install lint typecheck $(SCHEMA_STAMP) ## ruff, mypy and pytest (CPU; GPU tests skip without GPUs)
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadscope --no-loadscope-reorder

# A second small venv: only the newest kubernetes client (and what it needs) of its own,
# layered over .venv for everything else (torch, pytest, the package itself).
$(CLIENT_VENV)/.installed: $(VENV)/.installed
	$(PYTHON) -m venv $(CLIENT_VENV)
	$(CLIENT_VENV)/bin/python -m pip install -q "$(K8S_CLIENT_NEWEST)"
	$(PY) -c 'import site; print("import site; site.addsitedir(" + repr(site.getsitepackages()[0]) + ")")' \
		> "$$($(CLIENT_VENV)/bin/python -c 'import site; print(site.getsitepackages()[0])')/zz-base-venv.pth"
	touch $@

# The tests marked `client` (API calls, watches, retries, logs, dict bodies: the client's own
# code paths) again, under the newest client; make test runs them under kfp's pin.
test-client-newest: $(CLIENT_VENV)/.installed $(SCHEMA_STAMP) ## the client-marked tests with the newest kubernetes client
	$(CLIENT_VENV)/bin/python -c 'import kubernetes; print("kubernetes client", kubernetes.__version__)'
	$(CLIENT_VENV)/bin/python -m pytest -q -p no:cacheprovider -m client -n $(TEST_WORKERS) --dist loadscope --no-loadscope-reorder tests

lint: install ## ruff lint and format check
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

typecheck: install ## mypy
	$(VENV)/bin/mypy mnnvl components pipelines

compile: install ## regenerate the compiled KFP/Argo YAML in pipelines/compiled and components/
	$(PY) -m mnnvl.pipelines.compile

check-compiled: install ## fail when the committed compiled YAML differs from a fresh compile
	$(PY) -m mnnvl.pipelines.compile --check

render: install ## print every object a run would create (no cluster needed)
	$(PY) -m mnnvl render --run-id $(RUN_ID) --namespace $(NAMESPACE) --nodes $(NODES) --nodes-per-clique $(NODES_PER_CLIQUE) --gpus-per-node $(GPUS_PER_NODE)

bench: install ## CPU benchmarks (simulator API requests, concurrency, make run, compile)
	$(PY) bench/bench_api_requests.py
	$(PY) bench/bench_load.py
	$(PY) bench/bench_compile.py
	$(PY) bench/bench_make_run.py

test-gpu: ## GPU tests (run on a machine with >= 2 NVIDIA GPUs and torch installed)
	PYTHONPATH=. $(PYTHON) -m pytest -q -m gpu tests/gpu

images: ## build the launcher and runtime images (REGISTRY=…, TAG=…, PUSH=1, PLATFORMS=linux/amd64,linux/arm64)
	REGISTRY="$(REGISTRY)" TAG="$(TAG)" PUSH="$(PUSH)" PLATFORMS="$(PLATFORMS)" OCI_DIR="$(OCI_DIR)" \
	  bash scripts/build-images.sh

schemas: $(SCHEMA_STAMP) ## fetch the upstream schemas the tests validate against (into ./schemas)

$(SCHEMA_STAMP):
	bash scripts/fetch-schemas.sh $(SCHEMA_DIR)

clean: ## remove build outputs and local run outputs
	rm -rf build dist *.egg-info .mypy_cache .ruff_cache .pytest_cache out local_outputs
