# Two commands do everything:  `make lab` (open the course)  and  `make test` (run every check).
# Both create .venv and install the course into it the first time.
#
#   make lab                 JupyterLab on the course folder (notebooks/, exercises/, solutions/),
#                            opening the first lesson in a browser
#   make lab-server          the same, headless (for a remote server): prints the URL that opens chapter 00
#   make test                unit tests of course_lib, nbval over every solution notebook, every
#                            lesson in JupyterLab or under nbval (as on an 8-core machine), 00 with
#                            spawned workers, 03, 06 and 07 on PyTorch's plain CPU kernels, the
#                            grading of every chapter's submissions; then a table of durations
#   make test-quick          the inner loop (under 5 minutes on 2 cores): the library, chapter 01, a small class
#   make notebook NB=notebooks/01_collectives.ipynb   nbval over one notebook
#   make execute             re-execute and store every lesson and solution notebook (authors)
#   make exercises           regenerate exercises/ from solutions/ (authors, instructors)
#   make lock                regenerate requirements.lock, the versions every install uses (maintainers)
#   make test-oldest         the library's tests and every notebook at the oldest versions pyproject.toml
#                            allows (make test-latest: the newest), each in its own environment
#   make site                the executed lessons as static HTML in site/ (index = the README, the learners' page; docs/ beside it)
#   make browser-deps        Playwright + Chromium, so `make test` also runs every lesson in a real browser
#   make hub HUB_ROSTER=F HUB_DOMAIN=D  JupyterHub for a class on this server, as root: a user, namespaces, limits and an origin (D's subdomain) per learner (docs/instructors.md: "Hosting a class")
#
# CPU-only machine?  make lab TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
# installs PyTorch's small CPU wheels instead of the default CUDA build from PyPI.

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.course-installed
UV := $(VENV)/bin/uv
UV_VERSION := 0.13.9
TORCH_INDEX_URL ?=
NBVAL := --nbval --nbval-current-env --nbval-sanitize-with tests/nbval_sanitize.cfg --nbval-cell-timeout=300
NOTEBOOKS := notebooks solutions
# JupyterLab refuses to run as root (containers, cloud VMs) unless told it may.
LAB_ROOT := $(if $(filter 0,$(shell id -u)),--allow-root)
# The course folder is the lab's root, so the file browser reaches exercises/ and solutions/, which every
# lesson's last cell points to (a folder argument alone would make notebooks/ the root); the first lesson opens.
LAB_FILES := --ServerApp.root_dir="$(CURDIR)" notebooks/00_preflight.ipynb
LAB_PORT ?= 8888
LAB_OPTIONS ?=

.PHONY: lock test-oldest test-latest test-range setup lab lab-server test test-quick unit notebooks notebook execute exercises bench clean browser-deps site slurm-up slurm-down hub hub-deps

setup: $(STAMP)

# The course needs Python 3.11 or newer (nbgrader 0.9, which makes the exercises, does). Checked before
# .venv is made, and a .venv that an older Python made, or that a failed `python -m venv` left half-made,
# is made again instead of being reused.
PYTHON_OK = $(1) -c 'import sys; sys.exit(sys.version_info < (3, 11))' >/dev/null 2>&1
TOO_OLD = needs Python 3.11 or newer to make $(VENV), and '$(PYTHON)' is $$($(PYTHON) --version 2>&1 || echo "not found"). \
  Install one (Ubuntu 22.04: sudo apt install python3.11 python3.11-venv; macOS: brew install python@3.12) \
  and point make at it: make $(or $(MAKECMDGOALS),setup) PYTHON=python3.11

$(STAMP): pyproject.toml constraints.txt requirements.lock jupyter/overrides.json jupyter/ipython_kernel_config.py \
  jupyter/jupyter_server_config.py
	@if [ -e $(VENV) ] && ! { $(call PYTHON_OK,$(PY)) && $(PY) -m pip --version >/dev/null 2>&1; }; then \
	  echo "$(VENV) was made by another Python, or only half made: making it again"; rm -rf $(VENV); fi
	@if [ ! -x $(PY) ]; then \
	  if ! $(call PYTHON_OK,$(PYTHON)); then echo "make $(TOO_OLD)"; exit 1; fi; \
	  $(PYTHON) -m venv $(VENV) || { rm -rf $(VENV); echo "'$(PYTHON) -m venv' failed (Debian and Ubuntu: sudo apt \
	  install python3-venv, or python3.X-venv for your version)"; exit 1; }; fi
	@# Linux without an NVIDIA GPU: say what PyPI's default torch costs there, and how to choose the CPU wheels;
	@# at a terminal, wait 20 s before the download starts, so the advice is read before it scrolls away.
	@if [ -z "$(TORCH_INDEX_URL)" ] && [ "$$(uname -s)" = Linux ] && [ ! -e /dev/nvidia0 ]; then \
	  echo "No NVIDIA GPU here: PyPI's torch brings about 4 GB of CUDA libraries and triton that this machine will not use."; \
	  echo "For PyTorch's CPU wheels (a few hundred MB), stop now (Ctrl-C), remove $(VENV) and run:"; \
	  echo "  make $(or $(MAKECMDGOALS),setup) TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu"; \
	  if [ -t 0 ] && [ -t 1 ]; then echo "Going on with PyPI's torch in 20 s (Ctrl-C stops it)"; sleep 20; fi; fi
	@# uv installs from the same lock as pip would, in a third of its time (scripts/bench_setup.py, every
	@# wheel downloaded again, 2026-12-07 on the 2-core machine: pip 140 s, uv 46 s). Like pip, it compiles
	@# the bytecode as it installs: the ranks run with -B and would otherwise compile all of torch at each
	@# start. uv reads its own settings (UV_INDEX_URL, UV_NATIVE_TLS for a proxy's certificates), not pip's.
	$(PY) -m pip install -q uv==$(UV_VERSION)
	@if [ -n "$(TORCH_INDEX_URL)" ]; then \
	  $(UV) pip install --compile-bytecode --python $(PY) -c constraints.txt -c requirements.lock torch torchvision --index-url "$(TORCH_INDEX_URL)"; fi
	$(UV) pip install --compile-bytecode --python $(PY) -c constraints.txt -c requirements.lock -e ".[test,ft]"
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
	@# Kernels talk to the lab over Unix sockets on Linux, not over TCP ports (jupyter/jupyter_server_config.py).
	mkdir -p $(VENV)/etc/jupyter
	cp jupyter/jupyter_server_config.py $(VENV)/etc/jupyter/jupyter_server_config.py
	@touch $(STAMP)

lab: $(STAMP)
	$(VENV)/bin/jupyter lab $(LAB_FILES) $(LAB_ROOT)

# requirements.lock: every distribution of every extra, for every platform, from pyproject.toml and
# constraints.txt. Existing pins stay; `make lock UPGRADE=--upgrade` moves them all to the newest.
lock:
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q uv==$(UV_VERSION)
	$(VENV)/bin/uv pip compile pyproject.toml --extra test --extra browser --extra hub --extra ft -c constraints.txt \
	  --universal --python-version 3.11.5 --custom-compile-command "make lock" $(UPGRADE) -o requirements.lock

lab-server: $(STAMP)
	$(VENV)/bin/jupyter lab $(LAB_FILES) --no-browser --ip=127.0.0.1 --port=$(LAB_PORT) $(LAB_ROOT) \
	  --LabApp.default_url=/lab/tree/notebooks/00_preflight.ipynb $(LAB_OPTIONS)

# The suite runs as if on an 8-core laptop (each rank gets 8 // world_size intra-op threads),
# so the many-core code paths are exercised on a small CI machine too. Chapter 00, a learner's first
# contact, also runs with every worker started by spawn (as on macOS and Windows): spawn starts every
# rank of every launch as a fresh interpreter that imports torch, so chapter 01 under spawn cost 5.6
# CPU-minutes (9.5 of the suite's 40 minutes) to run the same launcher path again; and 03, 06 and 07, which print
# float32 training results (06 and 07's once moved with the CPU), on PyTorch's and MKL's plain kernels (which round
# differently from the AVX2/AVX-512 ones, as a grader's CPU might): same stored outputs.
# With a browser (make browser-deps), each lesson runs once in JupyterLab, which also compares
# its outputs with the stored ones; those four run there in their other kernel, and nbval runs
# 03, 06 and 07 in the default one, while chapter 00's run in the default kernel is the newcomer's
# (tests/test_newcomer.py: `make lab-server` from a fresh copy, chapter 00 in the browser, an exercise
# answered wrongly then rightly, and graded). Without a browser, nbval runs every lesson, then replays the four.
# At the end, a table of where the time went (scripts/test_durations.py).
# Test files run side by side in TEST_WORKERS pytest workers (pytest-xdist), each file (and each
# notebook, whose cells share one kernel) whole on one worker, in the order given: the two longest,
# the browser run and the grading run, start first on different workers. Much of a test's time is
# waiting (kernels and worker processes starting, timeouts that must pass, the browser), so two
# workers on 2 cores finish well before one. Three only add contention: measured, 23.3 minutes and
# 40.4 CPU-minutes against about 21 and 37 with two, and a grading fixture's 12 s setup timed out.
# OpenMP threads that wait for work sleep (OMP_WAIT_POLICY=PASSIVE) instead of spinning: with
# 8 cores' worth of threads on 2 real cores, a spinning thread only takes the CPU from another
# rank. The threads, and so every result, stay as on 8 cores; chapter 11's lesson, for one, needs
# half the CPU time (70 s -> 34 s) and runs in 26 s instead of 43 s.
TEST_ENV := OMP_WAIT_POLICY=PASSIVE
TEST_CPUS ?= 8
TEST_WORKERS ?= 2
PARALLEL := -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder
SPAWN_NOTEBOOKS := notebooks/00_preflight.ipynb
OTHER_CPU_NOTEBOOKS := notebooks/03_ddp.ipynb notebooks/06_mixed_precision.ipynb notebooks/07_accumulation_large_batch.ipynb
DURATIONS := .test-durations.jsonl
BROWSER_READY := $(PY) -c "import sys; sys.path.insert(0, 'tests'); from browser import missing_requirements; sys.exit(1 if missing_requirements() else 0)"
RECORD = $(TEST_ENV) COURSE_DURATIONS_FILE=$(DURATIONS) COURSE_TEST_STAGE

test: $(STAMP)
	@rm -f $(DURATIONS)
	@status=0; \
	if $(BROWSER_READY) 2>/dev/null; then \
	  echo "Lessons: once each in JupyterLab (outputs compared there); nbval runs $(OTHER_CPU_NOTEBOOKS)"; \
	  $(RECORD)="tests, solutions and 3 lessons" COURSE_CPUS=$(TEST_CPUS) \
	    COURSE_BROWSER_SPAWN="$(notdir $(SPAWN_NOTEBOOKS))" COURSE_BROWSER_PLAIN_KERNELS="$(notdir $(OTHER_CPU_NOTEBOOKS))" \
	    $(PY) -m pytest tests solutions $(OTHER_CPU_NOTEBOOKS) $(NBVAL) $(PARALLEL) -v || status=1; \
	else \
	  echo "No browser (make browser-deps): nbval runs every lesson, then replays four"; \
	  $(RECORD)="tests, solutions and lessons" COURSE_CPUS=$(TEST_CPUS) $(PY) -m pytest tests $(NOTEBOOKS) $(NBVAL) $(PARALLEL) -v || status=1; \
	  $(RECORD)="spawn replay" COURSE_START_METHOD=spawn $(PY) -m pytest $(SPAWN_NOTEBOOKS) $(NBVAL) -v || status=1; \
	  $(RECORD)="plain-kernel replay" ATEN_CPU_CAPABILITY=default MKL_CBWR=COMPATIBLE \
	    $(PY) -m pytest $(OTHER_CPU_NOTEBOOKS) $(NBVAL) -v || status=1; \
	fi; \
	$(PY) scripts/test_durations.py $(DURATIONS); \
	exit $$status

# The browser test's needs (tests/test_browser.py skips without them): Playwright from PyPI
# and a Chromium; as root on Debian/Ubuntu this installs the distribution's chromium package.
browser-deps: $(STAMP)
	$(UV) pip install --compile-bytecode --python $(PY) -c constraints.txt -c requirements.lock -e ".[browser]"
	@if command -v chromium >/dev/null || command -v chromium-browser >/dev/null; then echo "Chromium found"; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; \
	else echo "No Chromium: install your distribution's chromium package (or set COURSE_CHROMIUM)"; exit 1; fi

# JupyterHub for a class (jupyter/jupyterhub_config.py says what it does and which HUB_* variables
# it reads): the `hub` extra from PyPI, and the proxy in front of it, configurable-http-proxy, from
# npm into .venv/hub (nothing installed globally). That proxy is the one JupyterHub is made and
# tested with; the pure-Python port on PyPI is a young one-person project, and the Traefik proxy
# needs a binary download. Needs Node.js and npm.
HUB_PORT ?= 8000
HUB_STATE ?= .hub
CHP_VERSION := 5.3.0
HUB_STAMP := $(VENV)/hub/.installed

hub-deps: $(HUB_STAMP)

$(HUB_STAMP): $(STAMP) pyproject.toml constraints.txt requirements.lock
	$(UV) pip install --compile-bytecode --python $(PY) -c constraints.txt -c requirements.lock -e ".[hub]"
	npm install --prefix $(VENV)/hub --no-fund --no-audit --loglevel=error configurable-http-proxy@$(CHP_VERSION)
	@touch $(HUB_STAMP)

hub: $(HUB_STAMP)
	HUB_PORT=$(HUB_PORT) HUB_STATE=$(HUB_STATE) $(VENV)/bin/jupyterhub -f jupyter/jupyterhub_config.py

unit: $(STAMP)
	$(PY) -m pytest tests -v

# The inner loop while developing (CONTRIBUTING): the library's tests, chapter 01's lesson and solution
# under nbval, and the grading of a small class of chapter 01 (tests/test_grading.py); without the
# browser, the hub, Slurm, the sandbox's attacks and every chapter's class, which `make test` runs.
QUICK_SKIP := test_browser test_chapter_exercises test_hub test_hub_door test_slurm test_grading_slurm test_sandbox \
  test_notebook_kernel test_torchrun_claims test_setup test_learner_memory test_doc_commands
test-quick: $(STAMP)
	$(TEST_ENV) COURSE_CPUS=$(TEST_CPUS) $(PY) -m pytest tests $(foreach t,$(QUICK_SKIP),--ignore=tests/$(t).py) \
	  notebooks/01_collectives.ipynb solutions/01_collectives.ipynb $(NBVAL) $(PARALLEL) -q

# The supported range's two ends, each in an environment of its own (.venv-oldest, .venv-latest):
# every direct dependency at the lowest version pyproject.toml allows, or everything at the newest
# there is. They run the library's tests and every lesson and solution under nbval-lax (the stored
# outputs were made with requirements.lock's versions, so only errors and failed checks count; the
# grading, browser, hub and Slurm tests stay with `make test`). Run both before each lock refresh.
RANGE_TESTS := tests --ignore=tests/test_chapter_exercises.py --ignore=tests/test_browser.py \
  --ignore=tests/test_hub.py --ignore=tests/test_slurm.py --ignore=tests/test_grading_slurm.py --ignore=tests/test_setup.py
test-oldest:
	$(MAKE) test-range RANGE=oldest RESOLUTION="--resolution lowest-direct"
test-latest:
	$(MAKE) test-range RANGE=latest RESOLUTION=--upgrade
test-range:
	@test -x .venv-$(RANGE)/bin/python || $(PYTHON) -m venv .venv-$(RANGE)
	.venv-$(RANGE)/bin/python -m pip install -q uv==$(UV_VERSION)
	.venv-$(RANGE)/bin/uv pip compile pyproject.toml --extra test $(RESOLUTION) --python .venv-$(RANGE)/bin/python \
	  --no-header -q -o .venv-$(RANGE)/requirements.txt
	.venv-$(RANGE)/bin/uv pip install -q --python .venv-$(RANGE)/bin/python -r .venv-$(RANGE)/requirements.txt -e .
	.venv-$(RANGE)/bin/python -c "import torch, numpy, cloudpickle; print('$(RANGE): torch', torch.__version__, \
	  '| numpy', numpy.__version__, '| cloudpickle', cloudpickle.__version__)"
	$(TEST_ENV) COURSE_CPUS=$(TEST_CPUS) .venv-$(RANGE)/bin/python -m pytest $(RANGE_TESTS) $(NOTEBOOKS) \
	  --nbval-lax --nbval-current-env --nbval-cell-timeout=300 -n $(TEST_WORKERS) --dist loadfile -q

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
