#!/usr/bin/env bash
# `make soak`: the held-xmin soak (pg_test/tests/soak.rs) on one PostgreSQL
# version, ~8 minutes with the defaults; rewrites benches/results/soak-pg<ver>.md
# (command, commit, figures), keeping its trailing `## History` section (one
# file per workload family, not one per run: add the run's line to the history).
#
#   make soak                       # PG 15, defaults
#   SOAK_HOLD_S=600 make soak PG=16 # longer hold
# Env: SOAK_CLEAN_S SOAK_HOLD_S SOAK_RECOVERY_S SOAK_EVENT_RATE SOAK_JOB_RATE
set -euo pipefail
VER=${1:-15}
cd "$(dirname "$0")/.."
OUT=benches/results/soak-pg$VER.md
TMP=$(mktemp)
HIST=$(mktemp)
trap 'rm -f "$TMP" "$HIST"' EXIT
# The last section of the current file, if it is `## History`: carried over.
if [ -f "$OUT" ]; then
  awk '/^## /{buf=""; keep=($0=="## History")} keep{buf=buf $0 "\n"} END{printf "%s", buf}' "$OUT" > "$HIST"
fi
export SOAK_REPORT=$TMP
PGTEST_CARGO_ARGS="--test soak" bash pg_test/run.sh "$VER" --ignored --nocapture
# Before $OUT is (re)written, or it would count as an uncommitted change.
REV="$(git rev-parse --short HEAD)$(git diff --quiet HEAD -- src sql pg_test || echo ' (with uncommitted changes to src, sql or pg_test)')"
{
  echo "# Held-xmin soak, PostgreSQL $VER, $(date -u '+%Y-%m-%d %H:%M UTC')"
  echo
  echo "Command: \`make soak PG=$VER\`$(env | grep -E '^SOAK_(CLEAN|HOLD|RECOVERY|EVENT|JOB)' | sed 's/^/ /' | tr -d '\n')"
  echo "Commit: $REV; $(nproc) CPUs."
  echo "Test: pg_test/tests/soak.rs; assertions in pg_test/tests/soak_util/mod.rs (check)."
  echo
  cat "$TMP"
  if [ -s "$HIST" ]; then echo; cat "$HIST"; fi
} > "$OUT"
echo "soak: report in $OUT"
if [ -s "$HIST" ]; then
  echo "soak: kept the History section of $OUT: add this run's line to it (and a hand-written reading)"
fi
