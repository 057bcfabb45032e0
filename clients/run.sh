#!/usr/bin/env bash
# The client-library tier: installs pgque into one PostgreSQL version, starts
# a private cluster with pgque preloaded, runs the Python client's pytest
# suite, the Rust client's cargo tests, the TypeScript client's
# `node --test` suite and the Go client's `go test` against it, stops the
# cluster.
#
#   clients/run.sh 15                    # every client
#   clients/run.sh 15 python [ARGS]      # only pytest (ARGS go to pytest, e.g. -k worker)
#   clients/run.sh 15 rust [FILTER]      # only cargo test
#   clients/run.sh 15 typescript [ARGS]  # only node --test (ARGS go to node, e.g. --test-name-pattern=drain)
#   clients/run.sh 15 go [ARGS]          # only the Go client: go vet, gofmt -l, go test (ARGS go to go test, e.g. -run Worker)
#   clients/run.sh 15 trace              # only the OpenTelemetry pass (below)
#
# The python, rust and typescript passes run without OpenTelemetry (Python
# without the otel extra, Rust without the otel feature; the TypeScript dev
# dependencies include the API, unused without an SDK) and Rust's
# tests/tracing.rs with the feature. The trace pass then installs
# opentelemetry-api/sdk into clients/python/.otel (git-ignored, on
# PYTHONPATH for that pass only), builds the Rust and TypeScript hops and
# runs Python's tracing tests (jobs and events) and the cross-client traces
# (tests/test_cross_trace.py: Python producer -> Rust worker -> TS worker for
# jobs; a Python send and send_batch read by a Rust and a TS Consumer).
#
# The Python side runs in a venv (clients/python/.venv, git-ignored) that this
# script creates and fills from PyPI on first use (psycopg, pytest, setuptools, wheel),
# so a fresh machine needs nothing else. Env: PGTEST_PROFILE=tier|release|debug as
# for pg_test/run.sh (release default).
# The TypeScript side installs its pinned packages with `npm ci` into
# clients/typescript/node_modules (git-ignored) when they are missing or older
# than package-lock.json, and compiles with tsc (`npm run build`) each run.
set -euo pipefail
VER=${1:?usage: clients/run.sh PGVERSION [python|rust|typescript|go] [args]}
WHAT=${2:-all}
shift $(( $# >= 2 ? 2 : 1 ))
case "$WHAT" in all|python|rust|typescript|go|trace) ;; *) echo "unknown client '$WHAT' (python|rust|typescript|go|trace)" >&2; exit 2 ;; esac
want() { [ "$WHAT" = all ] || [ "$WHAT" = "$1" ]; }
cd "$(dirname "$0")/.."
ROOT=$(pwd)

. "$ROOT/scripts/pgcluster.sh"
pgq_pg_config "$VER"

# --- the Python venv (before the server: a failed fetch fails fast) ----------
VENV=$ROOT/clients/python/.venv
PY_PKGS=("psycopg[binary]==3.3.9" "pytest==8.4.2" "setuptools>=70.1" "wheel")
if want python || want trace; then
  [ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
  if ! "$VENV/bin/python" -c 'import psycopg, pytest, wheel' 2>/dev/null; then
    echo "[clients] pip install ${PY_PKGS[*]} into $VENV"
    "$VENV/bin/pip" install -q --disable-pip-version-check "${PY_PKGS[@]}"
  fi
  # The package as users install it (checks pyproject.toml), without fetching.
  "$VENV/bin/pip" install -q --disable-pip-version-check --no-deps --no-build-isolation --force-reinstall \
    "$ROOT/clients/python" >/tmp/pgque_clients_pip_$VER.log 2>&1 \
    || { cat /tmp/pgque_clients_pip_$VER.log; exit 1; }
fi

# --- the TypeScript package (before the server, like the venv) --------------
TS=$ROOT/clients/typescript
OTEL_PY=$ROOT/clients/python/.otel
OTEL_PY_PKGS=("opentelemetry-api==1.45.2" "opentelemetry-sdk==1.45.2")
if want trace; then
  if ! PYTHONPATH=$OTEL_PY "$VENV/bin/python" -c 'import opentelemetry.sdk.trace' 2>/dev/null; then
    echo "[clients] pip install ${OTEL_PY_PKGS[*]} into $OTEL_PY"
    "$VENV/bin/pip" install -q --disable-pip-version-check --target "$OTEL_PY" "${OTEL_PY_PKGS[@]}"
  fi
  cargo build -q --manifest-path "$ROOT/clients/rust/Cargo.toml" --features otel --example trace_hop --example event_hop
fi
if want typescript || want trace; then
  if [ ! -f "$TS/node_modules/.package-lock.json" ] || [ "$TS/package-lock.json" -nt "$TS/node_modules/.package-lock.json" ]; then
    echo "[clients] npm ci in $TS"
    (cd "$TS" && npm ci --no-audit --no-fund >/tmp/pgque_clients_npm_$VER.log 2>&1) \
      || { cat /tmp/pgque_clients_npm_$VER.log; exit 1; }
  fi
  (cd "$TS" && npm run -s build) || exit 1
fi

pgq_install "$VER" clients
DATA=/tmp/pgque_clients_$VER
PORT=$((54100 + VER))
# The TypeScript tier alone gets a cluster of its own, so that it can run
# beside another client's run on the same machine.
if [ "$WHAT" = typescript ]; then DATA=/tmp/pgque_clients_ts_$VER; PORT=$((54200 + VER)); fi
if [ "$WHAT" = go ]; then DATA=/tmp/pgque_clients_go_$VER; PORT=$((54300 + VER)); fi
# Databases as users make them: an ICU default on 15 (the build here with
# ICU), libc en_US.UTF-8 elsewhere (scripts/pgcluster.sh).
if [ "$VER" = 15 ]; then export PGQ_LOCALE=${PGQ_LOCALE:-icu}; fi
pgq_cluster_start "$DATA" "$PORT" "max_worker_processes = 32
max_connections = 200
listen_addresses = '127.0.0.1'
password_encryption = 'scram-sha-256'"
export PGQUE_TEST_HOST=$DATA PGQUE_TEST_PORT=$PORT
echo "[clients] PostgreSQL $VER on port $PORT (socket $DATA)"

# An application role as applications have one: it logs in over TCP with a
# scram-sha-256 password and holds only pgque_writer and pgque_reader (the
# tests' app_role files run every client through it; the other tests keep
# the superuser for their set-up). pgque's group roles are made here as
# CREATE EXTENSION would make them, which adopts them later.
APP_PASSWORD=$(head -c 18 /dev/urandom | base64 | tr -d '/+=')
as_pg sed -i '1i host all pgque_app 127.0.0.1/32 scram-sha-256' "$DATA/pg_hba.conf"
"$BINDIR/psql" -X -q -h "$DATA" -p "$PORT" -U postgres -d postgres -v ON_ERROR_STOP=1 -v pw="$APP_PASSWORD" <<'SQL' >/dev/null
DO $$ DECLARE r text; BEGIN
  FOREACH r IN ARRAY ARRAY['pgque_reader', 'pgque_writer', 'pgque_admin'] LOOP
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = r) THEN EXECUTE format('CREATE ROLE %I NOLOGIN', r); END IF;
  END LOOP;
END $$;
CREATE ROLE pgque_app LOGIN IN ROLE pgque_writer, pgque_reader;
ALTER ROLE pgque_app PASSWORD :'pw';
SELECT pg_reload_conf();
SQL
export PGQUE_TEST_APP_HOST=127.0.0.1 PGQUE_TEST_APP_USER=pgque_app PGQUE_TEST_APP_PASSWORD=$APP_PASSWORD
echo "[clients] application role pgque_app (pgque_writer, pgque_reader) over TCP 127.0.0.1:$PORT, scram-sha-256"

rc=0
if want python; then
  echo "==== clients: python (pytest)"
  (cd "$ROOT/clients/python" && "$VENV/bin/python" -m pytest -q -p no:cacheprovider "$@") || rc=$?
fi
if want rust && [ -f "$ROOT/clients/rust/Cargo.toml" ]; then
  echo "==== clients: rust (cargo test)"
  cargo test --manifest-path "$ROOT/clients/rust/Cargo.toml" -- "$@" || rc=$?
  echo "==== clients: rust with the otel feature (tests/tracing.rs, tests/event_tracing.rs)"
  cargo test --manifest-path "$ROOT/clients/rust/Cargo.toml" --features otel --test tracing --test event_tracing -- "$@" || rc=$?
fi
if want typescript; then
  echo "==== clients: typescript (node --test)"
  # TAP output: its closing lines are '# pass N' / '# fail N'. Two test files
  # at a time, each with a database of its own.
  (cd "$TS" && node --test --test-reporter=tap --test-concurrency=2 "$@" dist/test/*.test.js) || rc=$?
fi
if want go; then
  # The Go client (clients/go): its modules come through the Go module proxy
  # on first use (go.sum pins them). The output ends with go test's ok/FAIL lines.
  echo "==== clients: go (go vet, gofmt -l, go test)"
  (cd "$ROOT/clients/go" && go vet ./... \
    && { unformatted=$(gofmt -l .); [ -z "$unformatted" ] || { echo "gofmt -l: $unformatted"; exit 1; }; } \
    && go test -count=1 "$@" ./...) || rc=$?
fi
if want trace; then
  echo "==== clients: OpenTelemetry (python tracing tests, the cross-client trace)"
  (cd "$ROOT/clients/python" && PYTHONPATH=$OTEL_PY PGQUE_TEST_OTEL=1 \
    PGQUE_TRACE_RUST="${CARGO_TARGET_DIR:-$ROOT/clients/rust/target}/debug/examples/trace_hop" \
    PGQUE_TRACE_TS="node $TS/dist/test/trace_hop.js" \
    PGQUE_EVENT_RUST="${CARGO_TARGET_DIR:-$ROOT/clients/rust/target}/debug/examples/event_hop" \
    PGQUE_EVENT_TS="node $TS/dist/test/event_hop.js" \
    "$VENV/bin/python" -m pytest -q -p no:cacheprovider tests/test_tracing.py tests/test_event_tracing.py tests/test_cross_trace.py) || rc=$?
fi
if [ $rc -ne 0 ]; then
  echo "[clients] FAILED; last lines of the server log:"
  tail -40 "$DATA/server.log"
fi
exit $rc
