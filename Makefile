# `make demo` and `make test` each create .venv on first use (Python 3.11+ only).
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test install clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e ".[dev]"
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(PY) -m experiments.train experiments/configs/demo.yaml

test: $(STAMP)
	$(PY) -m pytest -q

clean:
	rm -rf $(VENV)
