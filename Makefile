# Two commands on a fresh machine (Python 3.11 and gcc): `make run` and `make test`.
PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
MODEL := smollm2-135m-instruct

.PHONY: run test install model services lint bench clean-state

$(VENV)/.installed: requirements.lock pyproject.toml
	@command -v $(PYTHON) >/dev/null || { echo "need $(PYTHON) on PATH"; exit 1; }
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r requirements.lock
	touch $@

install: $(VENV)/.installed

model: install
	$(PY) -m engine.models.prepare $(MODEL)

services: install
	$(PY) -m devstack services

run: model
	$(PY) -m devstack run

test: model
	$(PY) -m pytest

lint: install
	$(VENV)/bin/ruff check .

bench: model
	$(PY) -m bench.throughput --quick

clean-state:
	rm -rf .state
