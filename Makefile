# segrep: `make demo` sets up and runs the demo; `make test` sets up and runs the test suite.
PYTHON ?= python3.11
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
PYTEST_ARGS ?=

.PHONY: airflow venv demo test lint format bench bench-rounds bench-maintenance bench-object-store bench-failover bench-topologies bench-chaos bench-drills bench-links constraints clean spark-zip

$(STAMP): requirements.txt constraints.txt pyproject.toml
	@scripts/check_prereqs.sh $(PYTHON)
	$(PYTHON) -m venv $(VENV)
	@# uv (pinned in constraints.txt) installs the same pinned set as pip would, in a quarter of the time;
	@# compiled to bytecode as pip does (with PYTHONDONTWRITEBYTECODE set, nothing else ever writes it, and
	@# each process would compile every module again: 2 s more for each `segrep` command)
	$(BIN)/pip install --quiet uv -c constraints.txt
	$(BIN)/uv pip install --quiet --compile-bytecode --python $(BIN)/python -r requirements.txt -c constraints.txt
	$(BIN)/uv pip install --quiet --python $(BIN)/python --no-deps -e .
	@touch $(STAMP)

venv: $(STAMP)

demo: venv
	@scripts/demo.sh

test: venv
	@scripts/ensure_postgres.sh
	@scripts/install_browser.sh
	@# the repository's own modules compiled once: the suite starts hundreds of `segrep` and Airflow processes
	@$(BIN)/python -m compileall -q include dags plugins spark_jobs bench tests > /dev/null
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports
	$(BIN)/mypy
	$(BIN)/pytest -n 2 --dist loadfile --no-loadscope-reorder --durations=25 $(PYTEST_ARGS)

lint: venv
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports
	$(BIN)/mypy

format: venv
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

# Airflow with segrep's DAGs and plugin on this machine (scripts/airflow.sh says where the admin password is).
airflow: venv
	@scripts/airflow.sh

bench: venv
	$(BIN)/python bench/write_read.py

bench-rounds: venv
	@scripts/ensure_postgres.sh
	$(BIN)/python bench/rounds.py --scale 1
	$(BIN)/python bench/merge_crossover.py

bench-maintenance: venv
	$(BIN)/python bench/maintenance.py --scale 1

# Two moto servers on loopback stand for two object stores (tests/support/s3.py).
bench-object-store: venv
	$(BIN)/python bench/object_store.py --scale 1 --json bench/results/object-store.json

# Promote at 10,000 partitions, switchover with 1 GiB pending, failback after 1% diverged (PostgreSQL catalog).
bench-failover: venv
	@scripts/ensure_postgres.sh
	$(BIN)/python bench/failover.py --scale 1 --json bench/results/failover.json

# Bytes per link, broadcast vs cascade to 4 sites; a 3-site active-active ring's convergence vs 1:N.
bench-topologies: venv
	$(BIN)/python bench/topologies.py --scale 0.1 --json bench/results/topologies.json

# Restarts the local PostgreSQL cluster once: run it on a machine nothing else is using.
bench-chaos: venv
	@scripts/ensure_postgres.sh
	$(BIN)/python bench/chaos.py --seed 7 --kills 60 --catalog postgres
	$(BIN)/python bench/chaos.py --kill-recovery --catalog postgres

# Disaster drills, each ended by a replay compared at every site; PostgreSQL: a private cluster on port 55432.
bench-drills: venv
	$(BIN)/python bench/drills.py --seed 7 --kills 5 --json bench/results/drills.json

# Link caps across a round, a bootstrap and a scrub; RPO beside a bootstrap; window changes; unlimited = today's.
bench-links: venv
	$(BIN)/python bench/links.py --json bench/results/links.json

# The segrep package as a zip for spark-submit --py-files (Spark clusters whose nodes lack the package):
# export SEGREP_SPARK_PY_FILES=$$PWD/build/segrep.zip and both `segrep round` and the DAGs pass it on.
spark-zip: venv
	@mkdir -p build
	$(BIN)/python -c "import shutil; shutil.make_archive('build/segrep', 'zip', 'include', 'segrep')"
	@echo "build/segrep.zip: set SEGREP_SPARK_PY_FILES=$$PWD/build/segrep.zip"

constraints:
	@test -x $(BIN)/pip || { echo 'run make venv first'; exit 1; }
	@(echo "# Exact versions of every package in the environment (pip freeze of a fresh 'make venv'); regenerate with"; \
	  echo "# 'make constraints' after changing requirements.txt."; \
	  $(BIN)/pip freeze --exclude-editable | grep -v '^segrep') > constraints.txt

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .hypothesis
