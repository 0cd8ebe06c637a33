# Every target bootstraps .venv on its own, so `make test` / `make demo` work on a fresh machine.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp

.PHONY: install test lint fmt demo bench bench-full clean

$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	@touch $(STAMP)

install: $(STAMP)

# The tests mostly wait (loopback services, subprocesses, short timeouts): four workers
# (pytest-xdist) finish the suite in about a third of the time, even on two cores.
TEST_WORKERS ?= 4

# The package is byte-compiled first: with PYTHONDONTWRITEBYTECODE set (CI images, this
# machine), each of the hundreds of `fashiontag` subprocesses the suite starts compiled it
# again from source (~0.35 s of CPU a start), load that made start-up limits tight.
test: $(STAMP)
	$(PY) -m compileall -q fashiontag_pipeline
	$(PY) -m pytest -n $(TEST_WORKERS)

lint: $(STAMP)
	$(PY) -m ruff check fashiontag_pipeline tests benchmarks
	$(PY) -m ruff format --check fashiontag_pipeline tests benchmarks
	$(PY) -m mypy
	$(VENV)/bin/lint-imports

fmt: $(STAMP)
	$(PY) -m ruff format fashiontag_pipeline tests benchmarks
	$(PY) -m ruff check --fix fashiontag_pipeline tests benchmarks

demo: $(STAMP)
	$(VENV)/bin/fashiontag demo

bench: $(STAMP)
	@$(PY) -c 'import matplotlib' 2>/dev/null || $(PY) -m pip install -q -e '.[dev,bench]'
	$(PY) -m benchmarks --quick

bench-full: $(STAMP)
	@$(PY) -c 'import matplotlib' 2>/dev/null || $(PY) -m pip install -q -e '.[dev,bench]'
	$(PY) -m benchmarks --full

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache build *.egg-info
