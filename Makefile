# nvfp4 workbook: one entry point for setting up, testing and reproducing.
#
#   make test        run every test, notebooks included (small mode; 01 and 02 in full mode too)
#   make reproduce   execute every notebook: full mode on a GPU, small mode on a CPU
#
# With PYTHON unset, a .venv is created and the project installed into it on first use.
# With PYTHON set (e.g. `make reproduce PYTHON=python3` on an offline GPU node), that
# interpreter is used as it is and nothing is installed.

SHELL := /bin/bash
.DEFAULT_GOAL := help

PYTHON ?=
TORCH_VERSION ?= 2.13.0
TORCH_INDEX ?=
VENV ?= .venv
PYTEST_ARGS ?=
NOTEBOOK_ARGS ?=
BUILD_DIR := build
# Every target imports nvfp4lib from this checkout, also with PYTHON=<an interpreter without it installed>.
export PYTHONPATH := $(CURDIR)$(if $(PYTHONPATH),:$(PYTHONPATH))

ifeq ($(strip $(PYTHON)),)
PY := $(VENV)/bin/python
SETUP := $(VENV)/.installed
else
PY := $(PYTHON)
SETUP :=
endif

.PHONY: help test reproduce lab clean distclean

help: ## show this help
	@echo "Targets:"
	@grep -hE '^[a-z][a-z-]*:.*## ' $(MAKEFILE_LIST) | sed -E 's/:.*## /\t/' | awk -F'\t' '{printf "  %-16s %s\n", $$1, $$2}'
	@echo "Variables: PYTHON=<interpreter> uses an existing environment (installs nothing);"
	@echo "           TORCH_VERSION=$(TORCH_VERSION), TORCH_INDEX=<pip index for torch> (first install only),"
	@echo "           PYTEST_ARGS, NOTEBOOK_ARGS (e.g. --only 04, --small, --full),"
	@echo "           BENCH_ARGS (e.g. --quick, --only 'cute_*' peer_bf16; --list names the paths)"

# The virtual environment. torch is installed first and pinned, so that the `torch>=2.8`
# requirement is already met and pip does not pick a multi-GB CUDA build on a CPU machine;
# an environment that already has torch keeps it.
$(VENV)/.installed: pyproject.toml
	test -x $(VENV)/bin/python || python3 -m venv $(VENV)
	$(VENV)/bin/python -c "import torch" 2>/dev/null || $(VENV)/bin/python -m pip install "torch==$(TORCH_VERSION)" $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX))
	$(VENV)/bin/python -m pip install -e ".[dev,cute]"
	touch $@

test: $(SETUP) ## run all tests, notebooks included (small mode; 01 and 02 also in full mode)
	$(PY) -m pytest $(PYTEST_ARGS)

reproduce: $(SETUP) ## execute every notebook -> build/notebooks/: full mode on a GPU (figures/ on the committed figures' device, else build/figures/), small on a CPU (build/figures/)
	$(PY) tools/run_notebooks.py --out $(BUILD_DIR)/notebooks $(NOTEBOOK_ARGS)

# The kernel `make lab` registers, under the name the notebooks give: this checkout's nvfp4lib on its PYTHONPATH.
# It is installed where this checkout keeps things, never for the user (where every clone would write the same
# kernelspec): in .venv (--sys-prefix); with PYTHON=<interpreter>, whose prefix other checkouts may share (or
# that may not be writable), in build/jupyter. The server is started with that folder first on JUPYTER_PATH.
LAB_KERNEL := nvfp4
ifeq ($(strip $(PYTHON)),)
LAB_KERNEL_PREFIX := --sys-prefix
LAB_JUPYTER_DATA := $(abspath $(VENV))/share/jupyter
else
LAB_KERNEL_PREFIX := --prefix "$(abspath $(BUILD_DIR))/jupyter"
LAB_JUPYTER_DATA := $(abspath $(BUILD_DIR))/jupyter/share/jupyter
endif

lab: $(SETUP) ## start JupyterLab on 127.0.0.1 with the kernel "Python (nvfp4)" (this checkout's nvfp4lib), registered in .venv (with PYTHON=..., in build/jupyter)
	$(PY) -m ipykernel install $(LAB_KERNEL_PREFIX) --name $(LAB_KERNEL) --display-name "Python (nvfp4)" --env PYTHONPATH "$(CURDIR)"
	JUPYTER_PATH="$(LAB_JUPYTER_DATA)$(if $(JUPYTER_PATH),:$(JUPYTER_PATH))" $(PY) -m jupyter lab --ip=127.0.0.1 --no-browser $(if $(filter 0,$(shell id -u)),--allow-root)

# ---- Further targets go here, one block each, declared .PHONY, depending on $(SETUP) and
# ---- running $(PY) so that `PYTHON=...` works for them too; a `## text` comment puts them in help.

# ---- bench: timing runs on a GPU --------------------------------------------------------
BENCH_ARGS ?=
.PHONY: bench bench-cute calibrate
bench: $(SETUP) ## time every GEMV path and peer -> build/bench/<device>.csv and the 00_* figures: on a GPU in figures/ after a full run on the committed figures' device, else in build/figures/; on a CPU in build/bench/figures/
	$(PY) -m nvfp4lib.bench.suite $(BENCH_ARGS)

bench-cute: $(SETUP) ## check the CuTe kernels, then time them at the benchmark shapes (kernel, leaderboard and host time; streaming-read ceiling)
	$(PY) -m nvfp4lib.bench.cute_bench

calibrate: $(SETUP) ## time _scaled_mm vs CuTe per shape class on this GPU -> build/dispatch_table.json (skips without a GPU)
	$(PY) -m nvfp4lib.bench.calibration

# ---- submission: the leaderboard submission file ---------------------------------------
# The evaluator's INCOMPLETE verdict (every check that ran here passed; its line names what this machine could
# not check, e.g. the timed modes without CUDA) is success here; every other non-zero exit code fails the target.
SUBMISSION ?= hybrid
EVALUATE_INCOMPLETE := 4# nvfp4lib.leaderboard.report.EXIT_INCOMPLETE
.PHONY: submission
submission: $(SETUP) ## export SUBMISSION=<path> (default hybrid; list: .venv/bin/python -m nvfp4lib.leaderboard.export --list) to build/submission.py and check it (exit 0: every check this machine can run passed)
	$(PY) -m nvfp4lib.leaderboard.export --path $(SUBMISSION) --out $(BUILD_DIR)/submission.py --force
	$(PY) -m nvfp4lib.leaderboard.evaluate $(BUILD_DIR)/submission.py || { status=$$?; \
	  if [ $$status -ne $(EVALUATE_INCOMPLETE) ]; then exit $$status; fi; \
	  echo "make submission: $(BUILD_DIR)/submission.py exported; every check this machine can run passed (the INCOMPLETE line above names what it could not check)"; }

# ---- sanitize: compute-sanitizer runs of the kernels ------------------------------------
SANITIZE_ARGS ?=
.PHONY: sanitize
sanitize: $(SETUP) ## compute-sanitizer memcheck + racecheck of the CuTe kernels (GPU; says why and skips elsewhere)
	$(PY) -m nvfp4lib.bench.sanitize $(SANITIZE_ARGS)

# ---- blackwell-check: what only a B200 can check ----------------------------------------
.PHONY: blackwell-check
blackwell-check: $(SETUP) ## on a B200: sm100 + GPU tests, hardware FP4 decode vs its model, notebooks 03/04 (full), local leaderboard on the hybrid export and its fallback -> build/blackwell_report.md (elsewhere: says what it would run)
	$(PY) tools/blackwell_check.py

clean: ## remove build outputs and caches (keeps .venv and figures/)
	rm -rf $(BUILD_DIR) .pytest_cache .hypothesis
	find . -path ./$(VENV) -prune -o \( -name __pycache__ -o -name .ipynb_checkpoints \) -type d -print0 | xargs -0 -r rm -rf

distclean: clean ## also remove .venv (the next target reinstalls)
	rm -rf $(VENV) *.egg-info

# ---- profile: hardware counters of the CuTe kernels -------------------------------------
PROFILE_ARGS ?=
.PHONY: profile
profile: $(SETUP) ## Nsight Compute (clocks untouched) over the default kernel, notebook 04's progression and the per-K kernels at the benchmark shapes -> results/<device>_profile.csv (needs ncu and a GPU; says so and skips elsewhere)
	$(PY) -m nvfp4lib.bench.profile $(PROFILE_ARGS)

# ---- dsl-matrix: the kernels under each CuTe DSL release ---------------------------------
DSL_RELEASES ?=
.PHONY: dsl-matrix
dsl-matrix: $(SETUP) ## compile the default CuTe kernels (sm_90a, sm_100a) under each CuTe DSL release 4.3-4.8, each pip-installed into build/dsl/<release> -> results/dsl_matrix.md (no GPU needed; DSL_RELEASES=4.3.4,4.8.1 for fewer)
	$(PY) tools/dsl_matrix.py $(if $(DSL_RELEASES),--releases $(DSL_RELEASES))
