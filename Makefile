# The two commands the README starts with: `make demo` and `make test`.
# Everything else (virtualenv, dependencies, Kafka jars, services) is set up by them.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: demo test lint typecheck unit integration faults bench dev clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

## demo: run examples/lessons end to end on a throwaway local Kafka + PostgreSQL
demo: $(STAMP)
	$(BIN)/python -m examples.lessons.demo

## test: lint, type-check, then every test against a real Kafka broker and PostgreSQL
test: lint typecheck
	$(BIN)/python -m pytest $(PYTEST_ARGS)

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: $(STAMP)
	$(BIN)/mypy

unit: $(STAMP)
	$(BIN)/python -m pytest tests/unit $(PYTEST_ARGS)

integration: $(STAMP)
	$(BIN)/python -m pytest tests/integration $(PYTEST_ARGS)

## bench: every benchmark scenario on a throwaway local stack (under half an hour); see benchmarks/README.md
bench: $(STAMP)
	$(BIN)/pip install --quiet -e '.[dev,bench]'
	$(BIN)/python -m benchmarks $(BENCH_ARGS)

dev: $(STAMP)
	$(BIN)/kinbox dev

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache
