# `make demo` and `make test` each set up .venv on first use: torch==2.13.0 first (a CPU build;
# a bare `torch` requirement would pull a multi-gigabyte CUDA build), then this package with
# its torch, tensorflow (tensorflow-cpu, ~1.3 GB, ~20-90 s) and dev extras.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp
PIP := $(BIN)/python -m pip install --quiet --disable-pip-version-check

.PHONY: demo test lint bench clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(PIP) torch==2.13.0
	$(PIP) -e ".[torch,tensorflow,dev]"
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/spotfallback demo

test: $(STAMP)
	$(BIN)/ruff check src tests examples bench scripts
	$(BIN)/python -m pytest

lint: $(STAMP)
	$(BIN)/ruff check src tests examples bench scripts

bench: $(STAMP)
	$(BIN)/python -m bench

clean:
	rm -rf $(VENV) build src/*.egg-info
