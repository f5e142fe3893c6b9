# The two commands the README starts with: `make demo` and `make test`.
# Everything else (virtualenv, dependencies, Kafka jars, services) is set up by them.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
# The console's browser tests drive Debian's Chromium (Playwright's own browser
# download is not used). Missing, it is installed here when apt-get can; if it
# still is, those tests skip, or fail under CI=true.
CHROMIUM ?= /usr/bin/chromium

.PHONY: demo test lint typecheck unit integration faults bench dev clean browser docs docs-serve docs-reference

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev,docs]'
	touch $(STAMP)

## demo: run examples/lessons end to end on a throwaway local Kafka + PostgreSQL
demo: $(STAMP)
	$(BIN)/python -m examples.lessons.demo

## test: lint, type-check, build the docs site, then every test against a real Kafka broker and PostgreSQL
test: lint typecheck docs browser
	$(BIN)/python -m pytest $(PYTEST_ARGS)

## browser: Debian's chromium for the console's browser tests, installed when missing
browser:
	@if [ ! -x "$(CHROMIUM)" ] && command -v apt-get >/dev/null 2>&1; then \
		echo "installing chromium for the console's browser tests"; \
		SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
		( $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq chromium >/dev/null ) \
			|| echo "could not install chromium: the browser tests will skip (fail under CI=true)"; \
	fi

## docs: build the documentation site into site/; --strict fails on a broken link or include
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet

## docs-serve: the documentation site at http://127.0.0.1:8000, rebuilt on every change
docs-serve: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs serve

## docs-reference: rewrite docs/reference/ (CLI and configuration) from the code
docs-reference: $(STAMP)
	$(BIN)/python -m docs_tools.reference

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
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache site
