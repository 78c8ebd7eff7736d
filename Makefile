# segrep: `make demo` sets up and runs the demo; `make test` sets up and runs the test suite.
PYTHON ?= python3.11
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
PYTEST_ARGS ?=

.PHONY: venv demo test lint format bench constraints clean

$(STAMP): requirements.txt constraints.txt pyproject.toml
	@scripts/check_prereqs.sh $(PYTHON)
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade "pip>=24"
	$(BIN)/pip install --quiet -r requirements.txt -c constraints.txt
	$(BIN)/pip install --quiet --no-deps -e .
	@touch $(STAMP)

venv: $(STAMP)

demo: venv
	@scripts/demo.sh

test: venv
	@scripts/ensure_postgres.sh
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/pytest $(PYTEST_ARGS)

lint: venv
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

format: venv
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

bench: venv
	$(BIN)/python bench/write_read.py

constraints:
	@test -x $(BIN)/pip || { echo 'run make venv first'; exit 1; }
	@(echo "# Exact versions of every package in the environment (pip freeze of a fresh 'make venv'); regenerate with"; \
	  echo "# 'make constraints' after changing requirements.txt."; \
	  $(BIN)/pip freeze --exclude-editable | grep -v '^segrep') > constraints.txt

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .hypothesis
