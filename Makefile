# redisai-rs: build, run and test the Redis module target/release/libredisai.so.
# Backend libraries come from PyPI wheels into ~/.cache/redisai-rs (scripts/fetch-backend.sh).

SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help

PORT ?= 6379
# Server for `make run` and for the main flow-test run (Debian's Redis 7.0).
REDIS_SERVER_BIN ?= redis-server

VENV := .venv
PYTHON := $(VENV)/bin/python
VENV_STAMP := $(VENV)/.requirements.stamp
MODULE := $(CURDIR)/target/release/libredisai.so

# Every backend's cache dir, from the manifest in one call (no network here).
BACKEND_DIRS := $(shell scripts/fetch-backend.sh --dir onnxruntime tensorflow litert torch)
ifneq ($(words $(BACKEND_DIRS)),4)
  $(error scripts/fetch-backend.sh --dir failed)
endif

# ONNX Runtime.
ORT_DIR := $(word 1,$(BACKEND_DIRS))
ORT_VERSION := $(patsubst onnxruntime-%,%,$(notdir $(ORT_DIR)))
ORT_LIB := $(ORT_DIR)/lib/libonnxruntime.so.$(ORT_VERSION)
# Exported to every cargo run (build, test, clippy) alike, so that a build
# script watching it never sees it change between them.
export REDISAI_ONNX_LIB_DIR := $(ORT_DIR)/lib

# TensorFlow: libtensorflow_cc.so.2 + libtensorflow_framework.so.2 from the tensorflow-cpu wheel.
TF_DIR := $(word 2,$(BACKEND_DIRS))
TF_LIB := $(TF_DIR)/lib/libtensorflow_cc.so.2
export REDISAI_TF_LIB_DIR := $(TF_DIR)/lib

# TensorFlow Lite: libLiteRt.so (LiteRT's C API) from the ai-edge-litert wheel.
TFLITE_DIR := $(word 3,$(BACKEND_DIRS))
TFLITE_LIB := $(TFLITE_DIR)/lib/libLiteRt.so
export REDISAI_TFLITE_LIB_DIR := $(TFLITE_DIR)/lib

# libtorch (for the TORCH backend library, target/release/libredisai_torch.so, crate torch/).
TORCH_DIR := $(word 4,$(BACKEND_DIRS))
export LIBTORCH := $(TORCH_DIR)

# GPU flavour (docs/commands.md, section GPU): `make build GPU=1` also fetches scripts/backends-gpu.manifest
# (onnxruntime-gpu, libtorch's CUDA libraries) and links target/gpu/libredisai_torch_cuda.so; `make run GPU=1`
# loads them. The module is the same; without GPU nothing of this is fetched or built.
GPU ?=
GPU_ON = $(filter-out 0 no,$(GPU))

PYTEST_ARGS ?= -q
DIST_DIR := $(CURDIR)/target/dist
DIST_TARBALL = $(DIST_DIR)/redisai-rs-$(shell awk -F'"' '/^version = / { print $$2; exit }' Cargo.toml)-linux-x86_64.tar.gz
# `make wheel` writes the one redisai_rs-<version>-py3-none-manylinux_2_<n>_x86_64.whl here.
WHEEL_DIR := $(CURDIR)/target/wheel
# The C client module of the low-level API's flow tests (tests/llapi/llapi_test.c, tests/flow/test_llapi.py).
LLAPI_MODULE := $(CURDIR)/target/llapi/libllapi_test.so
PYTEST_ENV := REDISAI_MODULE=$(MODULE) REDISAI_ONNX_LIB=$(ORT_LIB) REDISAI_TF_LIB=$(TF_LIB) REDISAI_TFLITE_LIB=$(TFLITE_LIB) \
  REDISAI_DIST=$(DIST_TARBALL) REDISAI_WHEEL=$(WHEEL_DIR) REDISAI_LLAPI_MODULE=$(LLAPI_MODULE)

.PHONY: help build dist wheel gpu-bundle run test bench bench-responsiveness fuzz lint clean fetch-backends venv protofuzz soak leakcheck leakcheck-build llapi-module

help: ## List the targets
	@echo "redisai-rs make targets:"
	@grep -E '^[a-z][a-z-]*:.*## ' $(firstword $(MAKEFILE_LIST)) | \
	  awk -F':.*## ' '{ printf "  %-21s %s\n", $$1, $$2 }'
	@echo "Variables: PORT=$(PORT) REDIS_SERVER_BIN=$(REDIS_SERVER_BIN) PYTEST_ARGS='$(PYTEST_ARGS)' GPU=$(GPU)"

fetch-backends: ## Fetch backend libraries (ONNX Runtime, ...) into the cache
	scripts/fetch-backend.sh all

venv: $(VENV_STAMP) ## Create .venv with the flow-test requirements

# Rebuilt only when tests/requirements.txt changes.
$(VENV_STAMP): tests/requirements.txt
	python3 -m venv --clear $(VENV)
	$(PYTHON) -m pip install --disable-pip-version-check -q -r tests/requirements.txt
	touch $@

build: fetch-backends ## Build target/release/libredisai.so, its TORCH backend libredisai_torch.so and the backend worker redisai-worker
	cargo build --release --workspace
	test -f $(MODULE) && test -f $(dir $(MODULE))libredisai_torch.so && test -x $(dir $(MODULE))redisai-worker
	$(if $(GPU_ON),scripts/gpu-build.sh build)

dist: build ## Tarball in RedisAI's layout (redisai.so + backends/redisai_<backend>/) in target/dist
	scripts/dist.sh $(DIST_DIR)

wheel: build ## Python wheel in target/wheel: module + TORCH backend + launcher, backends as pinned dependencies
	python3 scripts/build-wheel.py $(WHEEL_DIR)

gpu-bundle: GPU := 1
gpu-bundle: build venv ## Small tarball (~3 MB) in target/dist to run scripts/gpu-check.sh on a GPU machine
	scripts/gpu-build.sh bundle $(DIST_DIR)

# Built with the redismodule.h of the redis-module crate the module is built with (its version from Cargo.lock;
# `cargo fetch` puts it in cargo's registry when no build has yet), so that the module and its test client see one API.
REDIS_MODULE_CRATE = redis-module-$(shell awk '/^name = "redis-module"$$/ { getline; gsub(/"/, "", $$3); print $$3; exit }' Cargo.lock)
FIND_REDISMODULE_H = find $${CARGO_HOME:-$$HOME/.cargo}/registry/src -path '*/$(REDIS_MODULE_CRATE)/src/include/redismodule.h' 2>/dev/null | head -1

llapi-module: $(LLAPI_MODULE) ## Build target/llapi/libllapi_test.so, the C module that tests the low-level C API (include/redisai.h)

$(LLAPI_MODULE): tests/llapi/llapi_test.c include/redisai.h Cargo.lock
	mkdir -p $(dir $@)
	h=$$($(FIND_REDISMODULE_H)); [[ -n $$h ]] || { cargo fetch --quiet && h=$$($(FIND_REDISMODULE_H)); }; \
	  [[ -n $$h ]] || { echo "redismodule.h of $(REDIS_MODULE_CRATE) not found in cargo's registry" >&2; exit 1; }; \
	  $(CC) -O2 -g -Wall -Wextra -Werror -fPIC -shared -pthread -Iinclude -I$$(dirname $$h) tests/llapi/llapi_test.c -o $@

run: build ## Run redis-server on 127.0.0.1:PORT (default 6379) with the module, ONNX Runtime and TensorFlow
	$(if $(GPU_ON),export LD_LIBRARY_PATH=$$(scripts/gpu-build.sh ld-path)$${LD_LIBRARY_PATH:+:$$LD_LIBRARY_PATH};) \
	exec $(REDIS_SERVER_BIN) --port $(PORT) --bind 127.0.0.1 --loadmodule $(MODULE) \
	  $(if $(GPU_ON),$$(scripts/gpu-build.sh load-args),ONNX $(ORT_LIB)) TF $(TF_LIB) TFLITE $(TFLITE_LIB)

# The flow suite runs with backends in worker processes (EXECUTION_MODE ISOLATED) on all three servers, and with
# backends in Redis's process (the default until isolation's figures hold) on Redis 7.0, where
# tests/flow/test_wheel.py (two fresh venvs from the wheel, about a minute) and test_dist.py run too.
test: build venv dist wheel llapi-module ## Unit tests, then the flow tests in-process on Redis 7.0 and isolated on Redis 7.0, Redis 8.2 and Valkey 9.1
	cargo test --release
	torch/tests/run-cpp-tests.sh
	redis70=$$(command -v $(REDIS_SERVER_BIN)); \
	servers=$$(scripts/servers.sh $(VENV)); eval "$$servers"; \
	export $(PYTEST_ENV); \
	REDIS_SERVER=$$redis70 scripts/run-pytest.sh "in-process, $$($$redis70 --version)" $(PYTEST_ARGS) tests/flow; \
	for server in $$redis70 $$REDIS82_SERVER $$VALKEY91_SERVER; do \
	  REDIS_SERVER=$$server REDISAI_EXECUTION_MODE=isolated scripts/run-pytest.sh "isolated, $$($$server --version)" \
	    $(PYTEST_ARGS) tests/flow --ignore=tests/flow/test_wheel.py --ignore=tests/flow/test_dist.py; \
	done

bench: build venv ## Benchmarks that print numbers against same-run baselines (bench/bench.py, bench/responsiveness.py)
	cargo build --release --example ort_inprocess
	cargo build --release --features system-alloc --target-dir $(LEAKCHECK_DIR) --example backend_inprocess
	$(PYTEST_ENV) $(PYTHON) bench/bench.py
	$(PYTEST_ENV) $(PYTHON) bench/responsiveness.py

bench-responsiveness: build venv ## PING latency while big models are stored/read and heavy models run (bench/responsiveness.py)
	$(PYTEST_ENV) $(PYTHON) bench/responsiveness.py

FUZZ_CASES ?= 1000000
fuzz: ## Property-test every parser, RDB decoder and model admission check with FUZZ_CASES random inputs each
	PROPTEST_CASES=$(FUZZ_CASES) cargo test --release -- commands::fuzz admission::

# Reliability runs (tests/reliability). SEED=<n> repeats a run; each prints the seed it used.
COMMANDS ?= 100000
MINUTES ?= 10
SEED_ARG = $(if $(SEED),--seed $(SEED))

protofuzz: build venv ## COMMANDS (default 100000) random/malformed AI.* commands pipelined, every reply checked
	$(PYTEST_ENV) $(PYTHON) tests/reliability/protocol_fuzz.py --commands $(COMMANDS) $(SEED_ARG)

soak: build venv ## MINUTES (default 10) of mixed traffic with saves, deletions, disconnects; memory must come back
	$(PYTEST_ENV) $(PYTHON) tests/reliability/soak.py --minutes $(MINUTES) $(SEED_ARG)

# valgrind sees every allocation of a module built with the system allocator (the default build allocates
# through Redis's jemalloc, and its over-aligned allocations rely on jemalloc's size classes).
LEAKCHECK_DIR := target/leakcheck
LEAKCHECK_MODULE ?= $(CURDIR)/$(LEAKCHECK_DIR)/release/libredisai.so

leakcheck-build: fetch-backends ## Build the module with the system allocator into target/leakcheck (for leakcheck)
	cargo build --release --features system-alloc --target-dir $(LEAKCHECK_DIR)

leakcheck: venv llapi-module $(if $(filter $(CURDIR)/$(LEAKCHECK_DIR)/%,$(LEAKCHECK_MODULE)),leakcheck-build) ## ~1.5 min ONNX workload under valgrind: fails on definite leaks or memory errors
	$(PYTEST_ENV) REDISAI_MODULE=$(LEAKCHECK_MODULE) $(PYTHON) tests/reliability/leakcheck.py $(SEED_ARG)

lint: fetch-backends ## cargo fmt --check, clippy with warnings as errors, no import cycle in src/ (scripts/check-imports.py)
	cargo fmt --check
	cargo clippy --release --workspace --all-targets -- -D warnings
	python3 scripts/check-imports.py --self-test src

clean: ## cargo clean and remove .venv (the backend cache stays)
	cargo clean
	rm -rf $(VENV)
