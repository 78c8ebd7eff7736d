#!/usr/bin/env bash
# The demo: two sites and TPC-H `orders` (scale 0.1) written in ten batches with updates and deletes,
# read back and checked against an independent replay of the batches. Resets data/sites and the catalog.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PWD/.venv/bin:$PATH"
export SEGREP_CONFIG=include/segrep.yaml
unset SEGREP_CATALOG_URL
DATA=data
say() { printf '\n\033[1m== %s\033[0m\n' "$*"; }

say "resetting $DATA/sites and $DATA/catalog.db (demo data only)"
rm -rf "$DATA/sites" "$DATA/catalog.db" "$DATA/catalog.db-wal" "$DATA/catalog.db-shm" "$DATA/demo"

say "segrep init && segrep apply"
segrep init
segrep apply

say "generating TPC-H orders (scale 0.1) and ten batches with ~5% updates and ~1% deletes"
mkdir -p "$DATA/demo"
python -m segrep.demo_data batches --table orders --key o_orderkey --scale 0.1 \
  --tpch-dir "$DATA/tpch/sf0.1" --out "$DATA/demo/batches" > "$DATA/demo/batches.tsv"
column -t "$DATA/demo/batches.tsv" 2>/dev/null || cat "$DATA/demo/batches.tsv"

say "writing the batches"
while IFS=$'\t' read -r file kind; do
  if [ "$kind" = delete ]; then out=$(segrep write orders "$file" --delete)
  else out=$(segrep write orders "$file"); fi
  echo "${out%%$'\n'*}"   # first line only (the summary); no pipe into head, which could cut segrep off
done < "$DATA/demo/batches.tsv"

say "segrep segments orders --site primary --partition 1"
segrep segments orders --site primary --partition 1

say "segrep table list"
segrep table list

say "segrep read orders --limit 5"
segrep read orders --limit 5

say "segrep read orders -o $DATA/demo/orders_read.parquet, checked against a replay of the batches"
segrep read orders -o "$DATA/demo/orders_read.parquet"
python -m segrep.demo_data check --key o_orderkey --batch-dir "$DATA/demo/batches" --read "$DATA/demo/orders_read.parquet"
