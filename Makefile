# Two commands do everything:  `make lab` (open the course)  and  `make test` (run every check).
# Both create .venv and install the course into it the first time.
#
#   make lab                 JupyterLab on notebooks/, opens a browser
#   make lab-server          the same, headless (for a remote server): prints the URL to open
#   make test                unit tests of course_lib + nbval over every lesson and solution notebook
#                            (as on an 8-core machine), then 00 and 01 again with spawned workers,
#                            then 06 and 07 again on PyTorch's plain CPU kernels
#   make notebook NB=notebooks/01_collectives.ipynb   nbval over one notebook
#   make execute             re-execute and store every lesson and solution notebook (authors)
#   make exercises           regenerate exercises/ from solutions/ (authors, instructors)
#   make site                the executed lessons as static HTML in site/ (index = this README)
#   make browser-deps        Playwright + Chromium, so `make test` also runs every lesson in a real browser
#
# CPU-only machine?  make lab TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
# installs PyTorch's small CPU wheels instead of the default CUDA build from PyPI.

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.course-installed
TORCH_INDEX_URL ?=
NBVAL := --nbval --nbval-current-env --nbval-sanitize-with nbval_sanitize.cfg --nbval-cell-timeout=300
NOTEBOOKS := notebooks solutions
# JupyterLab refuses to run as root (containers, cloud VMs) unless told it may.
LAB_ROOT := $(if $(filter 0,$(shell id -u)),--allow-root)

.PHONY: setup lab lab-server test unit notebooks notebook execute exercises bench clean browser-deps site slurm-up slurm-down

setup: $(STAMP)

$(STAMP): pyproject.toml constraints.txt jupyter/overrides.json jupyter/ipython_kernel_config.py
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@if [ -n "$(TORCH_INDEX_URL)" ]; then \
	  $(PY) -m pip install -c constraints.txt torch torchvision --index-url "$(TORCH_INDEX_URL)"; fi
	$(PY) -m pip install -c constraints.txt -e ".[test]"
	$(PY) -c "import torch, torchvision; print('torch', torch.__version__, '| torchvision', torchvision.__version__)"
	@# nbgrader is here only for its notebook preprocessors (exercises, grading): keep its
	@# course-management menus and server extensions out of the learners' JupyterLab.
	$(VENV)/bin/jupyter labextension disable --level=sys_prefix @jupyter/nbgrader >/dev/null 2>&1 || true
	for ext in formgrader validate_assignment assignment_list course_list; do \
	  $(VENV)/bin/jupyter server extension disable --sys-prefix nbgrader.server_extensions.$$ext >/dev/null 2>&1 || true; done
	@# The course's JupyterLab settings: no "official Jupyter news" pop-up over the notebook
	@# on a learner's first open, and no update checks (the lab may be offline).
	mkdir -p $(VENV)/share/jupyter/lab/settings
	cp jupyter/overrides.json $(VENV)/share/jupyter/lab/settings/overrides.json
	@# Kernels start the launch server as they start, so a learner's first launch is fast.
	mkdir -p $(VENV)/etc/ipython
	cp jupyter/ipython_kernel_config.py $(VENV)/etc/ipython/ipython_kernel_config.py
	@touch $(STAMP)

lab: $(STAMP)
	$(VENV)/bin/jupyter lab notebooks/ $(LAB_ROOT)

lab-server: $(STAMP)
	$(VENV)/bin/jupyter lab notebooks/ --no-browser --ip=127.0.0.1 --port=8888 $(LAB_ROOT)

# The suite runs as if on an 8-core laptop (each rank gets 8 // world_size intra-op threads),
# so the many-core code paths are exercised on a small CI machine too; then chapters 00 and 01
# run again with every worker started by spawn (as on macOS and Windows): same stored outputs.
# Last, 06 and 07, whose printed training results once moved with the CPU, run on PyTorch's and
# MKL's plain kernels, which round differently from the AVX2/AVX-512 ones as a grader's CPU
# might: same stored outputs.
TEST_CPUS ?= 8
SPAWN_NOTEBOOKS := notebooks/00_preflight.ipynb notebooks/01_collectives.ipynb
OTHER_CPU_NOTEBOOKS := notebooks/06_mixed_precision.ipynb notebooks/07_accumulation_large_batch.ipynb

test: $(STAMP)
	COURSE_CPUS=$(TEST_CPUS) $(PY) -m pytest tests $(NOTEBOOKS) $(NBVAL) -v
	COURSE_START_METHOD=spawn $(PY) -m pytest $(SPAWN_NOTEBOOKS) $(NBVAL) -v
	ATEN_CPU_CAPABILITY=default MKL_CBWR=COMPATIBLE $(PY) -m pytest $(OTHER_CPU_NOTEBOOKS) $(NBVAL) -v

# The browser test's needs (tests/test_browser.py skips without them): Playwright from PyPI
# and a Chromium; as root on Debian/Ubuntu this installs the distribution's chromium package.
browser-deps: $(STAMP)
	$(PY) -m pip install -c constraints.txt -e ".[browser]"
	@if command -v chromium >/dev/null || command -v chromium-browser >/dev/null; then echo "Chromium found"; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; \
	else echo "No Chromium: install your distribution's chromium package (or set COURSE_CHROMIUM)"; exit 1; fi

unit: $(STAMP)
	$(PY) -m pytest tests -v

notebooks: $(STAMP)
	$(PY) -m pytest $(NOTEBOOKS) $(NBVAL) -v

notebook: $(STAMP)
	$(PY) -m pytest $(NB) $(NBVAL) -v

execute: $(STAMP)
	$(PY) scripts/execute_notebooks.py $(NOTEBOOKS)

exercises: $(STAMP)
	$(PY) scripts/make_exercises.py

# The executed lessons as a static HTML site (site/index.html), for an instructor to host.
site: $(STAMP)
	$(PY) scripts/build_site.py --out site

bench: $(STAMP)
	$(PY) scripts/bench_launch.py
	$(PY) scripts/bench_ring.py

# A real Slurm cluster on this machine for chapter 04 (root; Debian/Ubuntu): two emulated nodes.
slurm-up:
	scripts/slurm_cluster.sh up

slurm-down:
	scripts/slurm_cluster.sh down

clean:
	rm -rf $(VENV) *.egg-info
