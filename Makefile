# `make demo` and `make test` each create .venv on first use (Python 3.11+ only).
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test test-fast docs serve-docs install clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e ".[tasks,experiments,dev,docs,gymnasium]"
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(PY) -m experiments.train experiments/configs/demo.yaml

# tests/run_files.py: one pytest process per test file, or per group of light files (in one process for the
# whole suite, XLA's CPU compiler crashed after a few hundred compilations), two at a time (three took more
# CPU and more time), each bounded by a timeout; every file runs, the exit status says.
test: $(STAMP)
	$(PY) tests/run_files.py --jobs 2
	$(PY) -m mkdocs build --strict --quiet

# The fast tier for the edit-and-test loop: the suite without the tests marked slow (learning runs, child
# processes, long sweeps). CI runs `make test`, which runs everything.
test-fast: $(STAMP)
	$(PY) tests/run_files.py --jobs 2 -m "not slow"

docs: $(STAMP)
	$(PY) -m mkdocs build --strict

serve-docs: $(STAMP)
	$(PY) -m mkdocs serve

clean:
	rm -rf $(VENV)
