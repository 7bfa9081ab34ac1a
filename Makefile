# Two entry points that do all the set-up on a fresh machine:
#   make demo   - main job on the embedded (generated) data, writes runs/demo/summary.json
#   make test   - lint + the whole test suite (two pytest workers)
#   make test-fast - lint + the suite without the tests marked slow (end-to-end training, ONNX exports)
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
PYTEST_ARGS ?=
# pytest-xdist workers (one per core of the 2-core build machines); each test file runs on one worker
PYTEST_JOBS ?= 2

.PHONY: demo test test-fast lint format install bench clean

$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# torch first, pinned to the wheels on the build machines; the project
	# only declares lower bounds, so pip keeps these.
	$(PY) -m pip install -q torch==2.14.1 torchvision==0.29.1
	$(PY) -m pip install -q -e ".[test]"
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(PY) -m tools.demo

test: $(STAMP)
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	$(PY) -m pytest -n $(PYTEST_JOBS) --dist loadfile $(PYTEST_ARGS)

test-fast: $(STAMP)
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	$(PY) -m pytest -n $(PYTEST_JOBS) --dist loadfile -m "not slow" $(PYTEST_ARGS)

lint: $(STAMP)
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .

format: $(STAMP)
	$(PY) -m ruff check --fix .
	$(PY) -m ruff format .

bench: $(STAMP)
	$(PY) tools/bench_core.py

clean:
	rm -rf runs dist build .pytest_cache .ruff_cache
