#!/usr/bin/env bash
# The demo: two sites and TPC-H `orders` (scale 0.1) written in ten batches with updates and deletes,
# replicated from `primary` to `dr` by the Airflow DAG (run with `airflow dags test`), then both sites are
# read back and checked against an independent replay of the batches. Resets data/sites and the catalog.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PWD/.venv/bin:$PATH"
export SEGREP_CONFIG=include/segrep.yaml
unset SEGREP_CATALOG_URL
DATA=data
export AIRFLOW_HOME="$PWD/$DATA/airflow"
export AIRFLOW__CORE__DAGS_FOLDER="$PWD/dags" AIRFLOW__CORE__LOAD_EXAMPLES=False
export AIRFLOW_CONN_SPARK_DEFAULT='{"conn_type": "spark", "host": "local[*]"}'
say() { printf '\n\033[1m== %s\033[0m\n' "$*"; }

# replay_check LABEL N...: primary and dr read exactly the replay of every batch, then batches N... written again
replay_check() {
  local label=$1; shift
  segrep read orders -o "$DATA/demo/orders_primary.parquet" --overwrite
  segrep read orders --site dr -o "$DATA/demo/orders_dr.parquet" --overwrite
  python - "$DATA/demo/orders_primary.parquet" "$DATA/demo/orders_dr.parquet" "$DATA/demo/batches" "$label" "$@" <<'PY'
import sys, pyarrow.parquet as pq
from pathlib import Path
from segrep.data import demo as demo_data
a, b = (pq.read_table(p).sort_by("o_orderkey") for p in sys.argv[1:3])
batches = demo_data.read_batch_files(Path(sys.argv[3]))
again = [batches[int(n) - 1] for n in sys.argv[5:]]
expected = demo_data.expected_rows([*batches, *again], "o_orderkey")
assert demo_data.compare(a, expected, "o_orderkey") == [], "primary differs from the replay"
assert a.equals(b), "dr differs from primary"
print(f"OK: {sys.argv[4]}, dr reads exactly what primary reads ({a.num_rows} rows), as the replay says")
PY
}

say "resetting $DATA/sites and $DATA/catalog.db (demo data only)"
rm -rf "$DATA/sites" "$DATA/catalog.db" "$DATA/catalog.db-wal" "$DATA/catalog.db-shm" "$DATA/demo" "$DATA/work"

if [ ! -f "$AIRFLOW_HOME/.migrated" ]; then
  say "airflow db migrate (Airflow's own metadata, in $AIRFLOW_HOME; once)"
  mkdir -p "$AIRFLOW_HOME"
  airflow db migrate > "$AIRFLOW_HOME/migrate.log" 2>&1 || { cat "$AIRFLOW_HOME/migrate.log"; exit 1; }
  touch "$AIRFLOW_HOME/.migrated"
fi

# One replication round: the DAG run whose data interval ends now (the engine never looks past the present).
round() {
  local log="$DATA/demo/airflow-round-$1.log" when
  when=$(python -c 'import pendulum; print(pendulum.now("UTC").add(hours=1).start_of("hour").to_iso8601_string())')
  say "airflow dags test segrep_replicate_orders $when   (log: $log)"
  if ! airflow dags test segrep_replicate_orders "$when" > "$log" 2>&1; then
    tail -40 "$log"; echo "the replication run failed; full log in $log" >&2; exit 1
  fi
  grep -F "[segrep.round]" "$log" | sed -E 's/^[^]]*\] (.*[^ ]) +\[segrep\.round\].*$/\1/' || true
}

say "segrep init && segrep apply"
segrep init
segrep apply

say "generating TPC-H orders (scale 0.1) and ten batches with ~5% updates and ~1% deletes"
mkdir -p "$DATA/demo"
python -m segrep.data.demo batches --table orders --key o_orderkey --scale 0.1 \
  --tpch-dir "$DATA/tpch/sf0.1" --out "$DATA/demo/batches" > "$DATA/demo/batches.tsv"
column -t "$DATA/demo/batches.tsv" 2>/dev/null || cat "$DATA/demo/batches.tsv"

write_batches() {  # lines $1..$2 of the batch list
  sed -n "$1,$2p" "$DATA/demo/batches.tsv" | while IFS=$'\t' read -r file kind; do
    if [ "$kind" = delete ]; then out=$(segrep write orders "$file" --delete)
    else out=$(segrep write orders "$file"); fi
    echo "${out%%$'\n'*}"   # first line only (the summary); no pipe into head, which could cut segrep off
  done
}
total=$(wc -l < "$DATA/demo/batches.tsv")
half=$((total / 2))

say "writing the first $half batches at primary"
write_batches 1 "$half"
round 1

say "writing the other $((total - half)) batches at primary"
write_batches $((half + 1)) "$total"

say "segrep status   (dr is behind: segments pending)"
segrep status
round 2

say "segrep status   (dr caught up)"
segrep status

say "segrep segments orders --site primary --partition 1"
segrep segments orders --site primary --partition 1

say "segrep table list"
segrep table list

say "segrep read orders --limit 5"
segrep read orders --limit 5

say "segrep read orders at primary and at dr, each checked against a replay of the batches"
segrep read orders -o "$DATA/demo/orders_primary.parquet"
segrep read orders --site dr -o "$DATA/demo/orders_dr.parquet"
python -m segrep.data.demo check --key o_orderkey --batch-dir "$DATA/demo/batches" --read "$DATA/demo/orders_primary.parquet"
python -m segrep.data.demo check --key o_orderkey --batch-dir "$DATA/demo/batches" --read "$DATA/demo/orders_dr.parquet"
python - "$DATA/demo/orders_primary.parquet" "$DATA/demo/orders_dr.parquet" <<'PY'
import sys, pyarrow.parquet as pq
a, b = (pq.read_table(p).sort_by("o_orderkey") for p in sys.argv[1:])
assert a.equals(b), "dr differs from primary"
print(f"OK: dr reads exactly what primary reads ({a.num_rows} rows)")
PY

say "split partition 1 of orders at 50000 and 100000 while it is live: airflow dags test segrep_split_orders"
log="$DATA/demo/airflow-split.log"
if ! airflow dags test segrep_split_orders -c '{"partition": 1, "split_keys": [50000, 100000]}' \
    > "$log" 2>&1; then
  tail -40 "$log"; echo "the split run failed; full log in $log" >&2; exit 1
fi
grep -E "^\s*(split [0-9]+ of|  child )" "$log" | sed 's/^.*\(split [0-9]\)/\1/; s/^.*\(  child \)/\1/' || true
segrep write orders "$(sed -n 1p "$DATA/demo/batches.tsv" | cut -f1)" > /dev/null  # a write after the split
round 3

say "segrep table describe orders   (partition 1 retired; three children serve its range)"
segrep table describe orders

say "after the split: primary and dr read exactly the replay of the batches (plus batch 1 written again)"
replay_check "after the split" 1

say "disaster recovery: what would a failover to dr lose right now?   segrep failover orders --dry-run"
segrep failover orders --dry-run

say "planned switchover to dr, nothing lost: airflow dags test segrep_failover (action switchover)"
log="$DATA/demo/airflow-switchover.log"
if ! airflow dags test segrep_failover -c '{"tables": ["orders"], "site": "dr", "action": "switchover", "dry_run": false}' \
    > "$log" 2>&1; then
  tail -40 "$log"; echo "the switchover run failed; full log in $log" >&2; exit 1
fi
grep -E "^\s*(switchover of|  loss|drain )" "$log" | sed 's/^.*\(switchover of\)/\1/; s/^.*\(  loss\)/\1/; s/^.*\(drain \)/\1/' || true
segrep write orders "$(sed -n 2p "$DATA/demo/batches.tsv" | cut -f1)" > /dev/null  # now written at dr
round 4

say "and back to primary from the command line: segrep switchover orders --to primary"
segrep switchover orders --to primary
segrep status orders

say "after the switchovers: primary and dr read exactly the replay (batch 2 written again, at dr)"
replay_check "after a switchover to dr and back" 1 2
