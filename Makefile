# Setup and everyday commands of the course. From a fresh clone, `make test`
# (or `make lab`) creates the virtualenv and installs everything first.

VENV ?= .venv
PYTHON ?= python3
PYTEST_ARGS ?=
# The suite's workers (pytest-xdist): a test mostly waits on its ranks, a browser or a kernel
# for a third of its time, and a second worker fills it. tests/conftest.py groups the modules.
TEST_WORKERS ?= 2
PARALLEL := -n $(TEST_WORKERS) --dist loadscope --no-loadscope-reorder
# Extra flags for `jupyter lab`, e.g. LAB_ARGS='--port=8889 --no-browser'.
LAB_ARGS ?=
# JupyterLab refuses to run as root without this; containers and CI often are root.
ROOT_FLAG := $(if $(filter 0,$(shell id -u)),--allow-root)

# Installed on its own, before the project: on the course machines this exact
# version is a local CPU wheel, while any other version (including the newest
# release that a bare torch>=2.4 would pick) downloads several GB of CUDA
# packages. Once it is installed, the project's torch>=2.4 is already satisfied.
TORCH_PIN := torch==2.13.0

INSTALL_STAMP := $(VENV)/.installed
# JupyterLab's defaults for everyone who opens the course (make lab, make demo, the handout, the hub):
# no "Would you like to get notified about official Jupyter news?" over the page on each first start.
LAB_OVERRIDES := $(VENV)/share/jupyter/lab/settings/overrides.json
LAB_INDEX := labs/index.ipynb
# The instructor's live demo: a notebook beside the solutions, not a lab.
DEMO := solutions/demo.ipynb
# Its instructor's mode, made afresh by each `make demo` from deploy/demo/: the file browser folded away
# (the JupyterLab workspace "demo") and larger type (JupyterLab settings of its own, not the user's).
DEMO_HOME := build/demo

.PHONY: install jail-tools sandbox-tools browser-tools slurm-tools site-tools site hub hub-tools hub-remove test test-fast test-lab lint lab demo demo-home release handout reference grade bench check-hardware clean

install: $(INSTALL_STAMP) $(LAB_OVERRIDES)

# Redone when pyproject.toml changes; pip skips what is already installed.
$(INSTALL_STAMP): pyproject.toml
	test -x $(VENV)/bin/python || $(PYTHON) -m venv $(VENV)
	$(VENV)/bin/python -m pip install -q $(TORCH_PIN)
	$(VENV)/bin/python -m pip install -q -e '.[test]'
	$(VENV)/bin/python -m pip install -q -e '.[spmd]'
	sh grader/jail-tools.sh
	touch $@

$(LAB_OVERRIDES): deploy/handout/jupyterlab-overrides.json $(INSTALL_STAMP)
	mkdir -p $(dir $@)
	cp $< $@

# The grader's jail; a no-op where bubblewrap is already installed.
jail-tools:
	sh grader/jail-tools.sh

# jail-tools' old name (deprecated: goes next term).
sandbox-tools:
	@echo "make sandbox-tools is deprecated and goes next term: make jail-tools" >&2
	@$(MAKE) --no-print-directory jail-tools

# The browser tests' chromium, from Debian; a no-op where it is already installed.
browser-tools:
	sh tests/browser-tools.sh

# Jupyter Book for the course's website, in a virtualenv of its own (its pins are not the course's):
# Jupyter Book 1, which builds from PyPI's packages alone (the 2nd fetches its theme at build time).
SITE_VENV := .venv-site
JUPYTER_BOOK_PIN := jupyter-book==1.0.4.post1
SITE_STAMP := $(SITE_VENV)/.installed
site-tools: $(SITE_STAMP)

$(SITE_STAMP):
	test -x $(SITE_VENV)/bin/python || $(PYTHON) -m venv $(SITE_VENV)
	$(SITE_VENV)/bin/python -m pip install -q '$(JUPYTER_BOOK_PIN)'
	touch $@

# The course as a website: build/site/_build/html/index.html, each lab as released with its figures
# (each solution run here for them). HUB_URL and REPOSITORY (and BRANCH, default main) add a launch button
# to a JupyterHub.
site: $(INSTALL_STAMP) $(SITE_STAMP)
	$(VENV)/bin/python -m course_tools site --out build/site $(if $(HUB_URL),--hub-url '$(HUB_URL)') $(if $(REPOSITORY),--repository '$(REPOSITORY)') $(if $(BRANCH),--branch '$(BRANCH)')

# Debian's Slurm and munge for the test that grades a class as a Slurm array; a no-op where installed.
slurm-tools:
	sh tests/slurm-tools.sh

test: $(INSTALL_STAMP) $(LAB_OVERRIDES) browser-tools slurm-tools site-tools hub-tools
	$(VENV)/bin/python -m pytest $(PARALLEL) --timing-report=test-artifacts/timings.md $(PYTEST_ARGS)

# The edit-run loop, about 2 minutes on 2 cores: every test that is none of the kinds
# pyproject.toml's markers name (browser, torchrun, notebook, grading, gpu, slurm, hub, slow).
test-fast: $(INSTALL_STAMP)
	$(VENV)/bin/python -m pytest $(PARALLEL) -m 'not (browser or torchrun or notebook or grading or gpu or slurm or hub or slow)' $(PYTEST_ARGS)

# Everything about one lab, every tier: its fairness tests and round trip, browser page (its run on
# 4 ranks), torchrun runs, tamper scan and guide (tests/README.md), e.g. LAB=02_data_parallel.
test-lab: $(INSTALL_STAMP) $(LAB_OVERRIDES) browser-tools slurm-tools site-tools hub-tools
	@test -n "$(LAB)" || { echo "usage: make test-lab LAB=02_data_parallel (a folder of solutions/)" >&2; exit 2; }
	$(VENV)/bin/python -m pytest $(PARALLEL) --lab '$(LAB)' $(PYTEST_ARGS)

# ruff, as configured in pyproject.toml; CI (.ci/run) runs it before the tests.
lint: $(INSTALL_STAMP)
	$(VENV)/bin/ruff check .

# JupyterLab on the course, landing on the notebook $(1) (in the workspace $(2), e.g. workspaces/demo/; more
# flags: $(3)). default_url (not a file argument) so that the printed URL, the browser and a visit to / all
# land on it, also with --no-browser on a remote machine.
jupyter_lab_on = $(VENV)/bin/jupyter lab --ServerApp.root_dir='$(CURDIR)' --LabApp.default_url=/lab/$(2)tree/$(1) $(3) $(ROOT_FLAG) $(LAB_ARGS)

# Listing the notebook as a prerequisite makes a missing one an error, not a 404 page.
lab: $(INSTALL_STAMP) $(LAB_OVERRIDES) $(LAB_INDEX)
	$(call jupyter_lab_on,$(LAB_INDEX))

# The live demo, for a projector, in the instructor's mode: Run All Cells (its measured time: bench/README.md).
demo: $(INSTALL_STAMP) $(LAB_OVERRIDES) $(DEMO) demo-home
	$(call jupyter_lab_on,$(DEMO),workspaces/demo/,--LabApp.user_settings_dir='$(abspath $(DEMO_HOME))/settings' --LabApp.workspaces_dir='$(abspath $(DEMO_HOME))/workspaces')

# The instructor's mode as deploy/demo/ has it, whatever the last demo changed.
demo-home: $(INSTALL_STAMP)
	rm -rf '$(DEMO_HOME)' && mkdir -p '$(DEMO_HOME)'
	cp -R deploy/demo/settings '$(DEMO_HOME)/settings'
	$(VENV)/bin/jupyter lab workspaces import --WorkspaceImportApp.workspaces_dir='$(abspath $(DEMO_HOME))/workspaces' deploy/demo/workspace.json

# Regenerates labs/ from solutions/.
release: $(INSTALL_STAMP)
	$(VENV)/bin/python -m grader release

# The students' copy: the release, the course package and how to open them, without the answers
# (build/handout/, and build/handout.zip for a course page). README.md: which path is for whom.
handout: $(INSTALL_STAMP)
	$(VENV)/bin/python -m course_tools handout --zip

# Re-records grader/reference/ (the hidden tests' stored values) from solutions/.
reference: $(INSTALL_STAMP)
	$(VENV)/bin/python -m grader reference

# Collect, autograde, feedback and grades.csv for SUBMISSIONS=<folder of student folders>.
grade: $(INSTALL_STAMP)
	@test -n "$(SUBMISSIONS)" || { echo "usage: make grade SUBMISSIONS=path/to/submissions" >&2; exit 2; }
	$(VENV)/bin/python -m grader grade '$(SUBMISSIONS)'

# Every benchmark, one report: bench/results/report.md and report.json (within 15 minutes on 2 cores; bench/_*.py
# are helpers, bench/report.py says which scripts run and with what), then the figures README.md and
# bench/README.md cite rewritten from it (bench/_citations.py prints each change; read them before committing).
# Fails when any benchmark fails; the report still says what the others measured.
# BENCH_FLAGS=--quick: each benchmark at its smallest, into build/bench-quick/ (a few minutes: that they run).
bench: $(INSTALL_STAMP)
	$(VENV)/bin/python bench/report.py $(BENCH_FLAGS)
	$(if $(filter --quick,$(BENCH_FLAGS)),,$(VENV)/bin/python bench/_citations.py --update)

# What an instructor runs on the cluster before the term: every lab's solution on this machine's devices
# (NCCL with a GPU a rank where there are enough, gloo otherwise): time and peak host and GPU memory, its
# hidden tests' values against the stored ones, what each collective sends against its formula, lab 1's
# step against the device's datasheet peak (MFU). One report, anything that failed with its reason:
# $(HARDWARE_REPORT)/report.md and report.json.
HARDWARE_CHECK := bench/labs.py bench/stored_values.py bench/comm_bytes.py bench/single_gpu.py
HARDWARE_REPORT ?= bench/results/hardware
check-hardware: $(INSTALL_STAMP)
	$(VENV)/bin/python bench/report.py $(HARDWARE_CHECK) --out $(HARDWARE_REPORT)

# A classroom on this machine, for a trial (docs/hub.md): JupyterHub serving the course to real Unix users,
# an instructor (formgrader) and students (the Assignment List), nbgrader's exchange between them. As root:
# deploy/hub/classroom.py makes the users, their passwords (HUB_ROOT/logins.json), the class's environment
# and the instructor's copy of the course, then JupyterHub runs here until Ctrl-C: http://127.0.0.1:$(HUB_PORT)/
HUB_ROOT ?= /srv/course-hub
HUB_HOMES ?= /home
HUB_INSTRUCTOR ?= instructor
HUB_STUDENTS ?= student1 student2
HUB_IP ?= 127.0.0.1
HUB_PORT ?= 8000
HUB_SETUP_ARGS ?=
hub: jail-tools hub-tools
	$(PYTHON) deploy/hub/classroom.py setup --root '$(HUB_ROOT)' --homes '$(HUB_HOMES)' --torch '$(TORCH_PIN)' \
		--instructor '$(HUB_INSTRUCTOR)' --students $(HUB_STUDENTS) $(HUB_SETUP_ARGS)
	COURSE_HUB_ROOT='$(HUB_ROOT)' COURSE_HUB_IP='$(HUB_IP)' COURSE_HUB_PORT='$(HUB_PORT)' \
		'$(HUB_ROOT)/venv/bin/jupyterhub' -f deploy/hub/jupyterhub_config.py

# Debian's python3-venv and npm for the classroom (a Python every user can run; JupyterHub's proxy).
hub-tools:
	sh deploy/hub/hub-tools.sh

# Removes the classroom: the users `make hub` made (their homes too) and HUB_ROOT.
hub-remove:
	$(PYTHON) deploy/hub/classroom.py remove --root '$(HUB_ROOT)'

# grader/work/ (submissions and the gradebook) is deliberately left alone.
clean:
	rm -rf $(VENV) $(SITE_VENV) .pytest_cache build dist *.egg-info
	find . -name __pycache__ -type d -prune -exec rm -rf {} +
