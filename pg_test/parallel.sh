#!/usr/bin/env bash
# Builds the pg_test crate's test binaries and runs them JOBS at a time
# against the server pg_test/run.sh started (its PGQUE_TEST_* environment).
#
#   pg_test/parallel.sh PG_TEST_DIR JOBS [cargo test args] -- [test binary args]
#
# Each binary's output is printed whole when it ends, under cargo's own
# "Running" header, so the "test result:" lines CI counts stay as cargo test
# prints them. Exit status: 0 when every binary passed. A binary that runs
# longer than PGTEST_TIMEOUT seconds (default 600) is killed and counts as
# failed: a hang must not eat CI's time limit.
set -uo pipefail
DIR=${1:?usage: parallel.sh PG_TEST_DIR JOBS [cargo args] -- [test args]}
JOBS=${2:?usage: parallel.sh PG_TEST_DIR JOBS [cargo args] -- [test args]}
shift 2
cargo_args=()
while [ $# -gt 0 ] && [ "$1" != -- ]; do cargo_args+=("$1"); shift; done
[ "${1:-}" = -- ] && shift
test_args=("$@")
TIMEOUT=${PGTEST_TIMEOUT:-600}
cd "$DIR" || exit 1

out=$(mktemp -d /tmp/pgque_pgtest_par.XXXXXX)
trap 'rm -rf "$out"' EXIT
if ! cargo test --no-run --manifest-path "$DIR/Cargo.toml" "${cargo_args[@]}" 2>"$out/build.log"; then
  cat "$out/build.log"; exit 1
fi
grep -v '^ *Executable ' "$out/build.log"
# "  Executable tests/worker.rs (/target/debug/deps/worker-0123abcd)"
sed -n 's/^ *Executable \(.*\) (\(.*\))$/\1\t\2/p' "$out/build.log" >"$out/list"

# The slow binaries first (seconds each, measured one at a time on 2 cores),
# then the rest in cargo's order.
slow="held_xmin idle worker_restart pool major_upgrade jobs_log worker consumer_plans standby hostile_worker delayed events_rotation schedules_crash slots_lease upgrade bad_input idem rate_limits jobs_enqueue events_basic"
order=()
for s in $slow; do
  line=$(grep -P "^tests/$s\.rs\t" "$out/list") && order+=("$line")
done
while IFS= read -r line; do
  name=${line%%$'\t'*}; name=${name#tests/}; name=${name%.rs}
  case " $slow " in *" $name "*) ;; *) order+=("$line") ;; esac
done <"$out/list"

busy() { awk '/^cpu / { print $2 + $3 + $4 + $7 + $8 }' /proc/stat; }

# Runs one binary, then prints its output in one piece (under a lock: other
# binaries end at the same time).
run_one() { # INDEX LABEL EXE
  local i=$1 label=$2 exe=$3 t0 t1 b0 b1 rc extra=""
  t0=$(date +%s%N); b0=$(busy)
  timeout --signal=KILL "$TIMEOUT" "$exe" "${test_args[@]}" >"$out/$i.log" 2>&1
  rc=$?
  t1=$(date +%s%N); b1=$(busy)
  [ "$rc" = 137 ] && extra=" (killed after ${TIMEOUT} s)"
  [ "$JOBS" = 1 ] && extra="$extra, machine busy $(( (b1 - b0) / 100 )) CPU s"
  {
    flock 9
    printf '     Running %s (%s)\n' "$label" "$exe"
    cat "$out/$i.log"
    printf '[pgtest] %s: %d.%01d s, exit %d%s\n' "$label" $(( (t1 - t0) / 1000000000 )) \
      $(( (t1 - t0) / 100000000 % 10 )) "$rc" "$extra"
  } 9>"$out/print.lock"
  echo "$rc" >"$out/$i.rc"
}

start=$(date +%s)
i=0
for line in "${order[@]}"; do
  while [ "$(jobs -rp | wc -l)" -ge "$JOBS" ]; do wait -n; done
  run_one "$i" "${line%%$'\t'*}" "${line#*$'\t'}" &
  i=$((i + 1))
done
wait

failed=()
for ((k = 0; k < i; k++)); do
  line=${order[$k]}
  [ "$(cat "$out/$k.rc" 2>/dev/null || echo 1)" = 0 ] || failed+=("${line%%$'\t'*}")
done
echo "[pgtest] $i test binaries, $JOBS at a time: $(( $(date +%s) - start )) s"
if [ ${#failed[@]} -gt 0 ]; then
  echo "[pgtest] failed: ${failed[*]}"
  exit 1
fi
