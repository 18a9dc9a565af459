# Two commands for a new user:  `make run`  (execute every notebook into build/)  and  `make test`.
# Both create the virtual environment in .venv on first use. On a machine that already has a CUDA
# build of torch, the venv sees the system packages and keeps that torch; elsewhere it installs the
# CPU wheel torch==2.13.0 and triton==3.7.1 (never a multi-GB CUDA build on a CPU-only machine).
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
HAS_CUDA_TORCH := $(shell $(PY) -c "import torch,sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null && echo 1)
PORT ?= 8888

.PHONY: test run lab venv clean report
venv: $(STAMP)

$(STAMP): pyproject.toml
ifeq ($(HAS_CUDA_TORCH),1)
	$(PY) -m venv --system-site-packages $(VENV)
	$(BIN)/pip install -q -e '.[test,notebooks,browser]'
else
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q -e '.[torch,test,notebooks,browser]'
endif
	$(BIN)/python -m ipykernel install --sys-prefix --name python3 >/dev/null
	touch $(STAMP)

test: $(STAMP)
	$(BIN)/python -m pytest $(PYTEST_ARGS)

run: $(STAMP)
	$(BIN)/python -m lora_moe_lab.nb.runner --out build

lab: $(STAMP)
	$(BIN)/python -m lora_moe_lab.nb.runner --lab --port $(PORT)

clean:
	rm -rf build .pytest_cache
