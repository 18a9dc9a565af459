# Two commands for a new user:  `make run`  (execute every notebook into build/)  and  `make test`.
# Both create the virtual environment in .venv on first use. On a machine that already has a CUDA
# build of torch, the venv sees the system packages and keeps that torch; elsewhere it installs
# torch==2.13.0 and triton==3.7.1 (the CPU wheel of torch where pip's find-links hold one: see UV_FIND_LINKS).
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
HAS_CUDA_TORCH := $(shell $(PY) -c "import torch,sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null && echo 1)
PORT ?= 8888

# The install is quiet (-q): say what it installs and how long it takes, from the measurement in
# data/setup/setup_time.json (studies/setup/record.py)
# Without a CUDA torch the venv is filled by uv (parallel downloads, bytecode compiled on every core), about three
# times faster than pip here. uv reads no pip config: pip's own find-links (where this machine keeps its CPU wheel
# of torch) are passed on; without one, torch==2.13.0 comes from PyPI, which on Linux x86_64 is its CUDA build.
UV_VERSION := 0.13.8
UV_FIND_LINKS := $(foreach d,$(shell $(PY) -m pip config get global.find-links 2>/dev/null),--find-links $(d))
SETUP_S := $(shell $(PY) -c "import json; print(round(json.load(open('data/setup/setup_time.json'))['median_s']))" 2>/dev/null || echo 80)

.PHONY: test test-all run lab venv clean report gpu-check gpu-probe record mutate tune
venv: $(STAMP)

$(STAMP): pyproject.toml
ifeq ($(HAS_CUDA_TORCH),1)
	@echo "set-up: creating $(VENV) on this machine's CUDA torch; pip installs the test and notebook tools and the browser test's driver (quietly, under $(SETUP_S) s)"
	$(PY) -m venv --system-site-packages $(VENV)
	$(BIN)/pip install -q -e '.[test,notebooks,browser]'
else
	@echo "set-up: creating $(VENV); uv installs torch and triton, the test and notebook tools and the browser test's driver, quietly: about $(SETUP_S) s on a 2-core machine (data/setup/setup_time.json)"
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q uv==$(UV_VERSION)
	$(BIN)/uv pip install -q --python $(BIN)/python --compile-bytecode $(UV_FIND_LINKS) -e '.[torch,test,notebooks,browser]'
endif
	@echo "set-up: registering the notebook kernel"
	$(BIN)/python -m ipykernel install --sys-prefix --name python3 >/dev/null
	touch $(STAMP)

# The suite runs on one pytest-xdist worker per core (at most 8; none on a single core), each worker on one thread
# (conftest.py). TEST_WORKERS=0 runs it in one process.
TEST_WORKERS ?= $(shell n=$$(nproc 2>/dev/null || echo 1); [ $$n -gt 8 ] && n=8; [ $$n -lt 2 ] && n=0; echo $$n)
# `make test` leaves out the tests marked slow (the largest random differentials, which the GPU check runs on the
# device); `make test-all` runs them on this machine too.
PYTEST_ARGS ?= -m "not slow"
test: $(STAMP)
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist worksteal $(PYTEST_ARGS)

test-all: $(STAMP)
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist worksteal

run: $(STAMP)
	$(BIN)/python -m lora_moe_lab.nb.runner --out build

lab: $(STAMP)
	$(BIN)/python -m lora_moe_lab.nb.runner --lab --port $(PORT)

# The GPU check (data/gpu_tests/README.md): the whole suite, then every notebook live with
# notebooks/params/gpu.yaml; a log with metadata in data/gpu_tests/. Uses the venv when it exists,
# else $(PY); on a machine without the venv (the system python has torch): make gpu-check PY=python3.
# GPU_CHECK_ARGS: e.g. "--what tests", "--what notebooks", "--wheels .whl", "--out DIR".
GPU_PY := $(if $(filter command line environment,$(origin PY)),$(PY),$(if $(wildcard $(STAMP)),$(BIN)/python,$(PY)))
gpu-check:
	PYTHONPATH=$(CURDIR)$${PYTHONPATH:+:$$PYTHONPATH} $(GPU_PY) scripts/gpu_check.py $(GPU_CHECK_ARGS)

# The probe (lora_moe_lab/instruments/recorders/probe.py): this machine's host lead, the fix's gain predicted
# from it, then measured; about two minutes on an H200. PROBE_ARGS: e.g. "--out build/probe.csv".
gpu-probe:
	PYTHONPATH=$(CURDIR)$${PYTHONPATH:+:$$PYTHONPATH} $(GPU_PY) -m lora_moe_lab.instruments.recorders.probe $(PROBE_ARGS)

# The tuner (lora_moe_lab/instruments/recorders/tune.py): this GPU's tile table and LoRA plan for one layer shape,
# written to lora_moe_lab/kernels/tile_tables/ (--tables DIR elsewhere). TUNE_ARGS: e.g. "--preset
# qwen3-30b-a3b-tp4 --resume --budget-s 540"; scripts/gpu_tune.sh runs both presets in 10-minute calls.
tune:
	PYTHONPATH=$(CURDIR)$${PYTHONPATH:+:$$PYTHONPATH} $(GPU_PY) -m lora_moe_lab.instruments.recorders.tune $(TUNE_ARGS)

# Every recording and the device it needs (scripts/record.py); `make record SECTION=kernels` runs one.
record: $(STAMP)
	$(BIN)/python scripts/record.py $(SECTION) $(RECORD_ARGS)

clean:
	rm -rf build .pytest_cache

# Mutation testing of the lesson's core (scripts/mutate.py: mutmut over the guards, the batch's metadata, the LoRA
# plan's decisions, the audit's rules and the schema checks); the score per module into data/mutation/. Minutes per
# module, one worker: not part of CI. MUTATE_ARGS: e.g. "guards", or "--again guards" after a test change.
mutate: $(STAMP)
	$(BIN)/pip install -q mutmut==3.8.1
	nice -n 10 $(BIN)/python scripts/mutate.py $(MUTATE_ARGS)
