#!/usr/bin/env bash
# Make sure the local PostgreSQL (127.0.0.1:5432) is up for the catalog tests; start it when it is down.
# In CI (CI=true) a PostgreSQL that cannot be started is an error; elsewhere the PostgreSQL tests skip.
set -uo pipefail
host=${SEGREP_PG_HOST:-127.0.0.1}
port=${SEGREP_PG_PORT:-5432}
ready() { pg_isready -q -h "$host" -p "$port" 2>/dev/null; }
if ! command -v pg_isready >/dev/null 2>&1; then
  msg="segrep: PostgreSQL client tools (pg_isready) not found"
  if [ "${CI:-}" = "true" ]; then echo "$msg: the PostgreSQL tests need a server at $host:$port" >&2; exit 1; fi
  echo "$msg; PostgreSQL tests will be skipped" >&2; exit 0
fi
if ready; then exit 0; fi
if [ -d /etc/postgresql ]; then
  echo "segrep: PostgreSQL is down at $host:$port; starting it" >&2
  pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql | head -n1)" main start || true
  for _ in $(seq 1 30); do ready && exit 0; sleep 1; done
fi
if [ "${CI:-}" = "true" ]; then
  echo "segrep: PostgreSQL at $host:$port is down and could not be started; the PostgreSQL tests cannot run" >&2
  exit 1
fi
echo "segrep: PostgreSQL at $host:$port is down; PostgreSQL tests will be skipped" >&2
