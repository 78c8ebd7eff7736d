#!/usr/bin/env bash
# `make airflow`: Airflow on this machine with segrep's DAGs (dags/) and plugins (plugins/), as one command.
#
# `airflow standalone` starts its parts (scheduler, dag-processor, triggerer, api-server) as child processes
# found by name on PATH, so the venv's bin directory goes first on PATH (without it: FileNotFoundError:
# 'airflow'). Airflow's logs live in $AIRFLOW_HOME (default data/airflow). Its metadata database is a database
# on the local PostgreSQL when one answers (scripts/airflow_database.py creates it; LocalExecutor: backfills
# and parallel runs work), else SQLite in $AIRFLOW_HOME, which the script says (the page's plugin then refuses
# backfills, which would lock SQLite). AIRFLOW__DATABASE__SQL_ALCHEMY_CONN, when set, wins. segrep's catalog
# is a separate database.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
export PATH="$ROOT/.venv/bin:$PATH"
export AIRFLOW_HOME="${AIRFLOW_HOME:-$ROOT/data/airflow}"
export AIRFLOW__CORE__DAGS_FOLDER="$ROOT/dags"
export AIRFLOW__CORE__PLUGINS_FOLDER="$ROOT/plugins"
export AIRFLOW__CORE__LOAD_EXAMPLES="${AIRFLOW__CORE__LOAD_EXAMPLES:-False}"
export SEGREP_CONFIG="${SEGREP_CONFIG:-$ROOT/include/segrep.yaml}"
export AIRFLOW_CONN_SPARK_DEFAULT="${AIRFLOW_CONN_SPARK_DEFAULT:-{\"conn_type\": \"spark\", \"host\": \"local[*]\"\}}"
# Airflow's api-server imports FastAPI's test client, which warns about httpx on every start.
export PYTHONWARNINGS="${PYTHONWARNINGS:-ignore:Using \`httpx\` with}"
# One setting moves the UI and the tasks' execution API together: SEGREP_AIRFLOW_PORT (or Airflow's own
# AIRFLOW__API__PORT), default 8080. With only the UI moved, every task failed with a bare "Connection refused"
# (or reached another Airflow listening on 8080).
PORT="${SEGREP_AIRFLOW_PORT:-${AIRFLOW__API__PORT:-8080}}"
case "$PORT" in
  ''|*[!0-9]*) echo "segrep: SEGREP_AIRFLOW_PORT must be a port number, not '$PORT'" >&2; exit 2 ;;
esac
export AIRFLOW__API__PORT="$PORT"
export AIRFLOW__CORE__EXECUTION_API_SERVER_URL="http://localhost:$PORT/execution/"
mkdir -p "$AIRFLOW_HOME"

if [ -z "${AIRFLOW__DATABASE__SQL_ALCHEMY_CONN:-}" ]; then
  set +e
  AIRFLOW_DB_URL=$(python "$ROOT/scripts/airflow_database.py")
  rc=$?
  set -e
  case $rc in
    0)
      export AIRFLOW__DATABASE__SQL_ALCHEMY_CONN="$AIRFLOW_DB_URL"
      export AIRFLOW__DATABASE__SQL_ALCHEMY_CONN_ASYNC="$AIRFLOW_DB_URL"  # psycopg 3 does both (no asyncpg)
      export AIRFLOW__CORE__EXECUTOR="${AIRFLOW__CORE__EXECUTOR:-LocalExecutor}"
      AIRFLOW_DB_SHOWN="PostgreSQL, database ${SEGREP_AIRFLOW_DB_NAME:-segrep_airflow} (LocalExecutor)"
      ;;
    3)
      export AIRFLOW__DATABASE__SQL_ALCHEMY_CONN="sqlite:///$AIRFLOW_HOME/airflow.db"
      AIRFLOW_DB_SHOWN="SQLite, $AIRFLOW_HOME/airflow.db: one task at a time, backfills refused (start PostgreSQL for them)"
      ;;
    *) exit "$rc" ;;
  esac
else
  AIRFLOW_DB_SHOWN="AIRFLOW__DATABASE__SQL_ALCHEMY_CONN (set by you)"
fi

if [ -z "${SEGREP_CATALOG_URL:-}" ] && [ ! -f "$ROOT/data/catalog.db" ]; then
  echo "segrep: no catalog yet: segrep init && segrep apply (definitions: $SEGREP_CONFIG)"
  segrep init
  segrep apply
fi

# One Airflow pool per link direction with max_concurrent_copies (segrep airflow-pools; docs/airflow.md), made
# or updated from the definitions at every start: a copy task whose pool does not exist would never be scheduled.
# The pools table needs a migrated database (standalone would migrate it after this). Without pooled links
# nothing is run; a definitions file that cannot be read is reported and Airflow starts anyway (its DAGs say why).
POOLS_FILE="$AIRFLOW_HOME/segrep_pools.json"
if segrep airflow-pools --json > "$POOLS_FILE"; then
  if [ "$(tr -d '[:space:]' < "$POOLS_FILE")" != "{}" ]; then
    airflow db migrate > "$AIRFLOW_HOME/segrep_db_migrate.log" 2>&1 || { cat "$AIRFLOW_HOME/segrep_db_migrate.log" >&2; exit 1; }
    airflow pools import "$POOLS_FILE"
  fi
else
  echo "segrep: the link pools were not updated (the definitions above are unusable)" >&2
fi

PASSWORDS="$AIRFLOW_HOME/simple_auth_manager_passwords.json.generated"
# The admin's password is made here on the first start (Airflow keeps a file it finds), so that the failover
# DAG can set its run's note through the REST API as admin (connection segrep_airflow_api, docs/airflow.md).
if [ ! -f "$PASSWORDS" ]; then
  (umask 077 && python -c 'import json, secrets, sys; json.dump({"admin": secrets.token_urlsafe(12)}, open(sys.argv[1], "w"))' "$PASSWORDS")
fi
ADMIN_PASSWORD=$(python -c 'import json, sys; print(json.load(open(sys.argv[1]))["admin"])' "$PASSWORDS")
export AIRFLOW_CONN_SEGREP_AIRFLOW_API="${AIRFLOW_CONN_SEGREP_AIRFLOW_API:-{\"conn_type\": \"http\", \"host\": \"http://localhost\", \"port\": $PORT, \"login\": \"admin\", \"password\": \"$ADMIN_PASSWORD\"\}}"
cat <<MSG
Airflow for segrep: http://localhost:$PORT (Ctrl-C stops every part; SEGREP_AIRFLOW_PORT moves it)
  AIRFLOW_HOME  $AIRFLOW_HOME
  database      $AIRFLOW_DB_SHOWN
  DAGs          $AIRFLOW__CORE__DAGS_FOLDER   (definitions: $SEGREP_CONFIG)
  plugins       $AIRFLOW__CORE__PLUGINS_FOLDER
  link pools    $POOLS_FILE   (segrep airflow-pools; imported above)
  log in as     admin, password in $PASSWORDS
                (made on the first start; also printed below as "Password for user 'admin'")
MSG
exec airflow standalone
