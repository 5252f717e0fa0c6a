# A learner: `make lab`. The course's two commands on a fresh machine: `make demo` and
# `make test` (see README.md).
# PYTHON: the first of python3.11, python3.12 and python3.13 that runs (a pyenv shim of a
# version that is not active is found but does not run); `make lab PYTHON=...` picks another.
ifeq ($(origin PYTHON),undefined)
PYTHON := $(shell for p in python3.11 python3.12 python3.13; do $$p -c '' >/dev/null 2>&1 && { echo $$p; break; }; done)
endif
VENV := .venv
BIN := $(VENV)/bin
# Two stamps, each built once, on one venv: the learner's install (the base of
# pyproject.toml, make lab) and the instructor's and tests' on top of it (the extras
# instructor and test: every other target). Both take the grading environment's exact pins
# (constraints.txt); a change of either file upgrades the venv, never rebuilds it.
LEARNER_STAMP := $(VENV)/.learner
STAMP := $(VENV)/.installed
PIP_INSTALL = $(BIN)/pip install --quiet -c constraints.txt
# make grade grades the nbgrader course directory COURSE (default: the one nbgrader_config.py
# names, this folder): its submitted/ as `nbgrader collect` leaves it. STUDENT=id and
# ASSIGNMENT=id (each a space-separated list) grade only those; DUEDATE="ID=DATE ..." sets
# assignments' due dates in the gradebook (space-separated pairs, e.g.
# DUEDATE="03_masking=2026-12-01 23:59 UTC 04_softmax=2026-12-08T23:59Z"; an EXTENSIONS
# row needs its assignment's due date, from here or the gradebook); EXTENSIONS=csv gives
# per-student due dates, TIMESTAMPS=csv overrides the collected submission times,
# JOBS=N workers (default: one per core), SCHEDULER=tcp://host:8786 a Dask cluster,
# DB_URL=postgresql://... the gradebook of a new COURSE; see docs/deploying.md.
COURSE ?=
STUDENT ?=
ASSIGNMENT ?=
DUEDATE ?=
EXTENSIONS ?=
TIMESTAMPS ?=
JOBS ?=
SCHEDULER ?=
DB_URL ?=
# make demo grades the sample class in its own course directory, DEMO.
DEMO ?= out/demo
# make check NOTEBOOK=notebooks/01_similarity/01_similarity.ipynb; make report ROSTER=roster.csv
NOTEBOOK ?=
ROSTER ?=
# Values are quoted for the shell: a URL holds & and ?.
GRADE_OPTS = $(if $(JOBS),--jobs '$(JOBS)') $(if $(SCHEDULER),--scheduler '$(SCHEDULER)') \
	$(if $(DB_URL),--db-url '$(DB_URL)') $(if $(DUEDATE),--duedate '$(DUEDATE)') \
	$(if $(EXTENSIONS),--extensions '$(EXTENSIONS)') \
	$(if $(TIMESTAMPS),--timestamps '$(TIMESTAMPS)') $(foreach s,$(STUDENT),--student '$(s)') \
	$(foreach a,$(ASSIGNMENT),--assignment '$(a)')

.PHONY: demo test test-fast bench tamper-report lab release grade screenshots figures clean wheel student-env

# torch==2.13.0 is the CPU build where pip finds it (this machine's wheel folder).
$(LEARNER_STAMP): pyproject.toml constraints.txt
	@test -n "$(PYTHON)" || { echo "make: no python3.11, python3.12 or python3.13 found: install one (Debian: apt-get install python3.11 python3.11-venv; or python.org), or name it: make PYTHON=/path/to/python3.12" >&2; exit 1; }
	@# a venv left by a failed first try on another Python (3.10, say) is made again, not reused
	@$(BIN)/python -c 'import sys; sys.exit(not (3, 11) <= sys.version_info[:2] <= (3, 13))' 2>/dev/null || \
	  { test ! -e $(VENV) || echo "make: $(VENV) is not a Python 3.11-3.13 venv: making it again with $(PYTHON)"; \
	    rm -rf $(VENV) && $(PYTHON) -m venv $(VENV); }
	$(BIN)/pip install --quiet --upgrade pip
	$(PIP_INSTALL) -e .
	touch $(LEARNER_STAMP)

$(STAMP): $(LEARNER_STAMP) pyproject.toml constraints.txt
	$(PIP_INSTALL) -e ".[instructor,test]"
	touch $(STAMP)

# configurable-http-proxy, the proxy JupyterHub starts, from the npm registry (hub/package-lock.json).
HUB_DEPS := hub/node_modules/.installed
$(HUB_DEPS): hub/package.json hub/package-lock.json
	npm ci --prefix hub --no-audit --no-fund --loglevel=error
	touch $(HUB_DEPS)

.PHONY: hub-deps hub
hub-deps: $(HUB_DEPS)

# The course on a local JupyterHub for a demo (as root): an instructor and two student
# accounts, the URL and passwords printed; Ctrl-C stops it and removes the accounts
# (make hub KEEP=1 keeps them). See hub/README.md.
KEEP ?=
hub: $(STAMP) $(HUB_DEPS)
	$(BIN)/python -m hub.launch $(if $(KEEP),--keep-accounts)

# The sample class graded in a course directory of its own (its submitted folder: sample_class/).
demo: $(STAMP) release
	$(BIN)/course-grader grade --course '$(DEMO)' --submitted sample_class $(GRADE_OPTS)

# The tests that stay in this process (the guard in tests/conftest.py holds every test not
# marked kernel, browser, cluster or hub to it) run on every core (pytest-xdist); then the
# others, one at a time: their sandboxes, servers and time limits assume a machine to themselves.
IN_PROCESS := not (kernel or browser or cluster or hub)
test: $(STAMP) $(HUB_DEPS) student-env selfstudy-env
	$(BIN)/python -m pytest -q -n auto -m "$(IN_PROCESS)"; in_process=$$?; \
	$(BIN)/python -m pytest -q --durations=20 -m "not ($(IN_PROCESS))"; others=$$?; \
	exit $$(( in_process || others ))

# The edit loop: the tests that stay in this process and take no more than a second or so
# each (not slow), on every core, drawing one student seed where `make test` draws many
# (tests/scope.py); the markers are in pyproject.toml.
test-fast: $(STAMP)
	COURSE_TEST_QUICK=1 $(BIN)/python -m pytest -q -n auto -m "$(IN_PROCESS) and not slow"

# The student package (coursekit/pyproject.toml): what a learner pip-installs, with no
# grader, solution or reference in it. setuptools builds in coursekit/build/, which is
# removed before (a stale copy would go into the wheel) and after.
WHEEL := dist/attention_coursekit-0.1.0-py3-none-any.whl
wheel: $(STAMP)
	rm -rf coursekit/build coursekit/*.egg-info $(WHEEL)
	$(BIN)/pip wheel --quiet --no-deps --no-build-isolation -w dist coursekit/
	rm -rf coursekit/build coursekit/*.egg-info

# The clean venv of tests/test_student_package.py and of the course hub's students
# (tests/test_hub.py), with the wheel, its hub extra and their pinned dependencies
# installed. Keyed by the wheel's bytes, it is built once per machine, outside the clone
# (/var/cache/attention-from-scratch/envs as root, or $ATTENTION_COURSE_ENVS; hub/environments.py):
# a fresh clone reuses it. The first build installs torch.
student-env: $(STAMP)
	$(BIN)/python -m hub.environments --extras hub

# The self-learner's package (selfstudy/pyproject.toml): coursekit, the student notebooks, the
# hidden checks (grader.checks) and the attention-course command, for check my work offline.
# hub/environments.py builds it from a temporary copy (selfstudy/ and what it takes from the
# checkout), never in the checkout. selfstudy-env is its clean venv, cached like student-env's.
SELFSTUDY_WHEEL := dist/attention_from_scratch_course-0.1.0-py3-none-any.whl
.PHONY: selfstudy-wheel selfstudy-env
selfstudy-wheel: $(STAMP)
	rm -f $(SELFSTUDY_WHEEL)
	$(BIN)/python -m hub.environments --selfstudy --wheel dist
selfstudy-env: $(STAMP)
	$(BIN)/python -m hub.environments --selfstudy

# Speed targets as ratios measured side by side in one run (never timed tests).
bench: $(STAMP)
	$(BIN)/python bench/stages.py
	$(BIN)/python bench/grading.py
	$(BIN)/python bench/multi_head.py
	$(BIN)/python bench/sanitize.py
	$(BIN)/python bench/transformer.py
	$(BIN)/python bench/throughput.py
	$(BIN)/python bench/check.py
	$(BIN)/python bench/bpe_incremental.py

# Mutation testing of the hidden checks: every mutant of every exercise's reference judged
# as a learner's submission on the public seed and SEEDS student seeds; prints the score per
# exercise and the survivors (grader/checks/_mutants.py). EXERCISE=id or TOPIC=name narrows it.
SEEDS ?= 20
EXERCISE ?=
TOPIC ?=
.PHONY: mutants
mutants: $(STAMP)
	$(BIN)/python -m grader.checks._mutants --seeds '$(SEEDS)' --jobs $$(nproc) \
		$(foreach e,$(EXERCISE),--exercise '$(e)') $(foreach t,$(TOPIC),--topic '$(t)')

# The tamper corpus graded by stock nbgrader and by ours, side by side.
tamper-report: $(STAMP)
	$(BIN)/python bench/tamper_vs_stock.py

# make release refuses while a notebook's read-only helper cells would hand out the answers
# of an assignment still open in the course's gradebook (docs/deploying.md, "Release
# order"); FORCE=1 releases anyway.
FORCE ?=
release: $(STAMP)
	$(BIN)/course-grader release $(if $(FORCE),--force)

grade: $(STAMP)
	$(BIN)/course-grader grade $(if $(COURSE),--course '$(COURSE)') $(GRADE_OPTS)

# Check my work: grade one saved notebook with the hidden checks, offline.
.PHONY: check report
check: $(LEARNER_STAMP)
	@test -n "$(NOTEBOOK)" || { echo "make check: say which notebook, e.g. make check NOTEBOOK=notebooks/01_similarity/01_similarity.ipynb" >&2; exit 2; }
	$(BIN)/course-grader check "$(NOTEBOOK)"

# The class report and the LMS grade tables, after make grade: COURSE/report/
# (make report COURSE=out/demo after make demo).
report: $(STAMP)
	$(BIN)/course-grader report $(if $(COURSE),--course '$(COURSE)') $(if $(ROSTER),--roster '$(ROSTER)')

# The learner's JupyterLab on notebooks/, with the learner's configuration (lab/: nbgrader's
# instructor screens off, Validate on); as root (a container, a hosted notebook) it starts too.
LAB_ARGS = --ServerApp.root_dir=notebooks $(if $(filter 0,$(shell id -u)),--allow-root)
lab: $(LEARNER_STAMP)
	JUPYTER_CONFIG_PATH="$(CURDIR)/lab$${JUPYTER_CONFIG_PATH:+:$$JUPYTER_CONFIG_PATH}" $(BIN)/jupyter lab $(LAB_ARGS)

# docs/screenshots/: each notebook in JupyterLab and its first figure, taken in Debian's
# chromium (apt-get install chromium) by the code of the browser test (tests/lab.py).
screenshots: $(STAMP)
	$(BIN)/python -m tests.lab docs/screenshots

# docs/figures/: the trained models' figures of the solution notebooks 09 and 10 (minutes of
# training; the same figures on any machine: fixed steps and seeds).
figures: $(STAMP)
	$(BIN)/python -m grader.docfigures

clean:
	rm -rf $(VENV) out build dist coursekit/build coursekit/*.egg-info
