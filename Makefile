# Two commands on a fresh machine (Python 3.11 and gcc): `make run` and `make test`.
PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
MODEL := smollm2-135m-instruct

.PHONY: run test install model static browser kubectl promtool services manage lint bench clean-state

$(VENV)/.installed: requirements.lock pyproject.toml
	@command -v $(PYTHON) >/dev/null || { echo "need $(PYTHON) on PATH"; exit 1; }
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r requirements.lock
	touch $@

install: $(VENV)/.installed

# Front-end libraries come from npm (package-lock.json pins them) and are copied into static/vendor/.
static/vendor/.built: package.json package-lock.json
	npm ci --ignore-scripts --no-audit --no-fund --loglevel=error
	mkdir -p static/vendor
	cp node_modules/htmx.org/dist/htmx.min.js node_modules/chart.js/dist/chart.umd.min.js static/vendor/
	touch $@

static: static/vendor/.built

# Debian's Chromium for the browser tests (Playwright drives it by path; nothing is downloaded by Playwright).
browser:
	bash devstack/browser.sh

# kubectl, whose kustomize renders deploy/kubernetes/ for its test (Debian's kubernetes-client where none is).
kubectl:
	bash devstack/kubectl.sh

# promtool for the tests of deploy/prometheus/ (Debian's prometheus package).
promtool:
	bash devstack/promtool.sh

model: install
	$(PY) -m engine.models.prepare $(MODEL)

services: install
	$(PY) -m devstack services

run: model static
	$(PY) -m devstack run

# An operator command against the running `make run` stack, from any shell: make manage ARGS="usage_report".
# No install step: it runs beside make run's processes, on the venv they run on.
manage:
	@test -x $(PY) || { echo "no $(VENV): run make run (or make install) first"; exit 1; }
	$(PY) -m devstack manage $(ARGS)

test: model static browser kubectl promtool
	$(PY) -m pytest

lint: install
	$(VENV)/bin/ruff check .

# Quick mode of every benchmark (about 25 minutes on 2 cores, plus the peers: vLLM's CPU build and llama.cpp's
# server, installed once into ~/.cache/lora-platform/bench, the llama.cpp build about 10-20 minutes), then the
# report the README copies.
bench: model
	$(PY) -m bench.throughput --quick
	$(PY) -m bench.multi_lora --quick
	$(PY) -m bench.serve --quick
	$(PY) -m bench.gateway --quick
	$(PY) -m bench.peers --quick
	$(PY) -m bench.structured --quick
	$(PY) -m bench.spec_decode --quick
	$(PY) -m bench.fairness --quick
	$(PY) -m bench.replicas --quick
	$(PY) -m bench.report

clean-state:
	rm -rf .state
