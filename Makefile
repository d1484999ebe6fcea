# Two entry points for a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
TINY_MODEL ?= data/models/batchrun-tiny
# The demo decodes with the shipped model; without one, with a tiny random model (garbage text).
DEMO_MODEL ?= $(if $(wildcard $(TINY_MODEL)/config.json),$(TINY_MODEL),.cache/models/tiny-random)
DEMO_DB    ?= demo.duckdb
PYTEST_ARGS ?=             # e.g. --durations=25 (.ci/run)
# Test processes: two keep both cores busy while end-to-end tests wait on their subprocesses
# (`make test PYTEST_WORKERS=0` runs in one process). Ray tests share one worker (xdist_group).
PYTEST_WORKERS ?= 2

.PHONY: setup demo test test-slow test-all lint gpu-check gpu-check-image train-model eval-model clean

# Where torch comes from: these machines' pip index serves 2.13.0 as a CPU build; pypi.org's Linux wheel is
# the multi-GB CUDA one, so there pass TORCH_PIP_ARGS='--index-url https://download.pytorch.org/whl/cpu'.
TORCH_PIP_ARGS ?=

# A worktree whose .venv links to another checkout's uses that venv as it is: reinstalling it from here would
# point the other checkout's editable install (and its entry points) at this tree.
ifeq ($(shell test -L $(VENV) && echo link),link)
$(VENV)/.installed:
	@echo "$(VENV) links to another checkout's venv: used as it is, not installed from here"
else
$(VENV)/.installed: pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	# torch first and pinned, so installing the project finds it there and pulls no other build
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install --quiet torch==2.13.0 $(TORCH_PIP_ARGS)
	$(PY) -m pip install --quiet -e '.[test]'
	touch $@
endif

# Third-party MCP servers for the conformance suite (tests/batch/cli/test_conformance.py), pinned, in a
# git-ignored folder: server-everything with npm (skipped without it), mcp-server-time with
# `pip --target` (its own mcp never replaces the venv's).
MCP_SERVERS ?= .cache/mcp-servers
SERVER_EVERYTHING_VERSION := 2026.8.31
MCP_SERVER_TIME_VERSION := 2026.10.19
MCP1_VERSION := 1.30.0

$(MCP_SERVERS)/.installed: | $(VENV)/.installed
	-command -v npm >/dev/null && npm install --silent --no-audit --no-fund --prefix $(MCP_SERVERS)/node \
		@modelcontextprotocol/server-everything@$(SERVER_EVERYTHING_VERSION)
	$(PY) -m pip install --quiet --target $(MCP_SERVERS)/python mcp-server-time==$(MCP_SERVER_TIME_VERSION)
	touch $@

# A server built on mcp 1.x (tests/support/sampling_server.py runs on it), apart from the venv's 2.x.
$(MCP_SERVERS)/mcp1/.installed: | $(VENV)/.installed
	$(PY) -m pip install --quiet --target $(MCP_SERVERS)/mcp1 mcp==$(MCP1_VERSION)
	touch $@

# Headless Chromium for the report's browser tests (tests/evals/test_report_browser.py), from the
# distribution's packages where apt and root are at hand (~3 min once); elsewhere those tests skip
# and say why.
TEST_TOOLS ?= .cache/test-tools
$(TEST_TOOLS)/chromium.checked:
	-command -v chromium >/dev/null || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null && \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium >/dev/null; }
	mkdir -p $(TEST_TOOLS) && touch $@

TEST_DEPS := $(VENV)/.installed $(MCP_SERVERS)/.installed $(MCP_SERVERS)/mcp1/.installed $(TEST_TOOLS)/chromium.checked

setup: $(TEST_DEPS)

$(DEMO_MODEL)/config.json: | $(VENV)/.installed
	$(VENV)/bin/batchrun make-random-model $(DEMO_MODEL)

demo: $(VENV)/.installed $(DEMO_MODEL)/config.json
	rm -f $(DEMO_DB)
	$(VENV)/bin/batchrun submit data/examples/quickstart.jsonl --db $(DEMO_DB) \
		--model $(DEMO_MODEL) --max-output-tokens 256 --conversation-date 2026-01-01
	@echo
	@echo "Results are in $(DEMO_DB). Try:"
	@echo "  $(VENV)/bin/batchrun runs --db $(DEMO_DB)"
	@echo "  $(VENV)/bin/batchrun sql --db $(DEMO_DB) \"SELECT custom_id, status, output_tokens, latency_s FROM responses\""

test: $(TEST_DEPS)
	$(PY) -m pytest -q -n $(PYTEST_WORKERS) --dist loadgroup $(PYTEST_ARGS)

# the tests marked slow (~17 min on 2 cores); CI runs them after `make test`, but the MoE's sm_90 compiles (.ci/run)
test-slow: $(TEST_DEPS)
	$(PY) -m pytest -q -m slow -n $(PYTEST_WORKERS) --dist loadgroup $(PYTEST_ARGS)

test-all: $(TEST_DEPS)
	$(PY) -m pytest -q -m '' -n $(PYTEST_WORKERS) --dist loadgroup $(PYTEST_ARGS)

# ruff over the whole repo; mypy over every package (engine/ and batch/ with every def annotated;
# see pyproject.toml).
lint: $(VENV)/.installed
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy

# The GPU check (scripts/gpu_check.sh): engine-only steps, one log in GPU_CHECK_OUT, <= 8 minutes on a GPU.
# It needs only torch, transformers, triton and pytest, so it uses PYTHON (the GPU image's python3), not the
# venv. A CPU dry run of every step at tiny shapes: make gpu-check GPU_CHECK_DRY_RUN=1 PYTHON=.venv/bin/python
GPU_CHECK_OUT ?= $(or $(OUT),gpu-check-out)
gpu-check:
	PYTHON=$(PYTHON) GPU_CHECK_DRY_RUN=$(GPU_CHECK_DRY_RUN) bash scripts/gpu_check.sh $(GPU_CHECK_OUT)

# The same dry run under the GPU image's transformers and triton (5.17 and 3.6; torch stays this machine's
# 2.13 CPU build, Python 3.11 for the image's 3.12), in a venv of its own: the venv's newer transformers
# hid an AttributeError that failed every engine step of the check under 5.17. CI runs it.
GPU_IMAGE_VENV ?= .cache/gpu-image-venv
# numpy < 2.4: triton 3.6's interpreter (the dry run's routing step runs that kernel in it) takes int() of a
# 1-element array at a loop over a kernel argument, which numpy 2.4 refuses; on a GPU nothing is interpreted
GPU_IMAGE_PACKAGES := transformers==5.17.0 triton==3.6.0 safetensors "numpy<2.4" pytest
$(GPU_IMAGE_VENV)/.installed: Makefile  # new pins reinstall
	test -x $(GPU_IMAGE_VENV)/bin/python || $(PYTHON) -m venv $(GPU_IMAGE_VENV)
	$(GPU_IMAGE_VENV)/bin/python -m pip install --quiet torch==2.13.0 $(TORCH_PIP_ARGS)
	$(GPU_IMAGE_VENV)/bin/python -m pip install --quiet $(GPU_IMAGE_PACKAGES)
	touch $@

# The dry run's benches use the torch kernels, and `make test` compiles the Triton kernels for sm_90 under this
# venv's triton: the sm_90 compile tests run again here under the image's.
SM90_TESTS := tests/engine/test_moe_sm90.py tests/engine/test_triton_attention.py tests/engine/test_triton_fused.py \
	-k "compile or inner_loop"
gpu-check-image: $(GPU_IMAGE_VENV)/.installed
	PYTHON=$(GPU_IMAGE_VENV)/bin/python GPU_CHECK_DRY_RUN=1 bash scripts/gpu_check.sh $(GPU_CHECK_OUT) || \
		{ tail -n 60 $(GPU_CHECK_OUT)/gpu_check.log; exit 1; }
	PYTHONPATH=scripts/engine_only:. $(GPU_IMAGE_VENV)/bin/python -m pytest -q -rs -m "" -p no:cacheprovider $(SM90_TESTS)

# Train the embedded tiny model from scratch (seed 0, ~40-50 min on 2 shared CPU cores; it prints
# the share of 200 held-out tasks greedy decoding reproduces as it goes); eval-model measures it
# through `batchrun submit` on 240 tasks per held-out set (see trainer/ and the README).
# One thread, as the shipped model was trained (results are bit-identical only for the same count):
# with two, any other process on a 2-core machine stalls every step (5-10x slower, measured).
train-model: $(VENV)/.installed
	$(PY) -m trainer.train --threads 1 --out $(TINY_MODEL)

eval-model: $(VENV)/.installed
	$(PY) -m trainer.evaluate --model $(TINY_MODEL)

clean:
	rm -rf $(VENV) .cache $(DEMO_DB) build *.egg-info
