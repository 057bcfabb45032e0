#!/usr/bin/env bash
# `make soak`: the held-xmin soak (pg_test/tests/soak.rs) on one PostgreSQL
# version, ~8 minutes with the defaults; writes
# benches/results/<date>-soak-pg<ver>.md (command, commit, figures).
#
#   make soak                       # PG 15, defaults
#   SOAK_HOLD_S=600 make soak PG=16 # longer hold
# Env: SOAK_CLEAN_S SOAK_HOLD_S SOAK_RECOVERY_S SOAK_EVENT_RATE SOAK_JOB_RATE
set -euo pipefail
VER=${1:-15}
cd "$(dirname "$0")/.."
OUT=benches/results/$(date -u +%Y-%m-%d)-soak-pg$VER.md
TMP=$(mktemp)
trap 'rm -f "$TMP"' EXIT
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
} > "$OUT"
echo "soak: report in $OUT"
