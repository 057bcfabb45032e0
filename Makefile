# pgque: the two commands a new user needs are `make run` and `make test`.
# Both start with `make setup`, which takes a fresh machine to ready (apt
# packages, cargo-pgrx, PostgreSQL 14-18) and takes seconds when it is done.

PG ?= 15
VERSIONS ?= 14 15 16 17 18
# The multi-session / SQL regression tier runs on these versions.
PGTEST_VERSIONS ?= 14 15 18

.PHONY: setup test lint package test-package pgrx-test pgtest test-web test-clients test-compat soak run stop bench psql cluster cluster-stop help

help:
	@echo "make run      build, start a local PostgreSQL $(PG) with pgque preloaded, show a demo"
	@echo "make stop     stop that server"
	@echo "make cluster  a sharded pgque: PL/Proxy router (port 55460) + 2 shards (55461, 55462)"
	@echo "make cluster-stop   stop it"
	@echo "make test     every check and test on PostgreSQL $(VERSIONS)"
	@echo "make pgtest PG=16   only the server-level tier (pg_test/) on one version"
	@echo "make test-web  the dashboard (pgque-web) in headless Chromium"
	@echo "make test-clients   the Python, Rust, TypeScript and Go client libraries against a real server"
	@echo "make test-compat    PgQue's Python client (pgque-py 0.2.2) against pgque"
	@echo "make package  .deb per major (14-18), tarballs and META.json into <target>/pgque-package"
	@echo "make bench    side-by-side benchmarks (benches/)"
	@echo "make soak     held-xmin soak, ~8 min (not part of make test; results in benches/results/soak-pg<N>.md)"

setup:
	@bash scripts/setup.sh

# ---- tests ------------------------------------------------------------------
test: setup lint pgrx-test
	@for v in $(PGTEST_VERSIONS); do $(MAKE) --no-print-directory pgtest PG=$$v || exit 1; done
	@$(MAKE) --no-print-directory test-web
	@$(MAKE) --no-print-directory test-clients PG=15
	@$(MAKE) --no-print-directory test-compat PG=15
	@$(MAKE) --no-print-directory test-package
	@echo "make test: all green on PostgreSQL $(VERSIONS) (server tier on $(PGTEST_VERSIONS))"

lint:
	@bash scripts/check_meta.sh
	python3 scripts/layers.py --self-test
	python3 scripts/layers.py
	python3 scripts/upgrade_draft.py --self-test
	cargo fmt --all -- --check
	cargo fmt --manifest-path pg_test/Cargo.toml --all -- --check
	cargo clippy --no-default-features --features "pg15 pg_test" --all-targets -- -D warnings
	cargo clippy --manifest-path pg_test/Cargo.toml --all-targets -- -D warnings
	cargo clippy -p pgque-web --all-targets -- -D warnings
	cargo fmt --manifest-path clients/rust/Cargo.toml --all -- --check
	cargo clippy --manifest-path clients/rust/Cargo.toml --all-targets -- -D warnings
	cd clients/go && go vet ./...
	@cd clients/go && test -z "$$(gofmt -l .)" || { echo "gofmt -l clients/go:"; gofmt -l .; exit 1; }

# Pure-Rust #[test]s and in-server #[pg_test]s, in one binary per version.
# cargo pgrx test installs the library in place: unlink it first, so that a
# server running from the same installation (make run) keeps the file it maps.
PGRX_CONFIG = $(or $(PGRX_HOME),$(HOME)/.pgrx)/config.toml
pgrx-test:
	@for v in $(VERSIONS); do \
	  d=/tmp/pgque_pgrx_$$v; mkdir -p $$d; chown postgres $$d 2>/dev/null || true; \
	  pgc=$$(sed -n "s/^pg$$v = \"\(.*\)\"$$/\1/p" $(PGRX_CONFIG)); \
	  bash scripts/install.sh --unlink "$$pgc" || exit 1; \
	  echo "==== cargo pgrx test pg$$v"; \
	  cargo pgrx test pg$$v --runas postgres --pgdata $$d || exit 1; \
	done

# The dashboard: pgque-web's unit tests, then /metrics and every page in
# headless Chromium against a private PostgreSQL 15 (web/tests/run.sh).
test-web: setup
	@echo "==== pgque-web tests"
	cargo test -p pgque-web
	@bash web/tests/run.sh 15

pgtest: setup
	@echo "==== pg_test tier on PostgreSQL $(PG)"
	@bash pg_test/run.sh $(PG)

# The client libraries (clients/python, clients/rust, clients/typescript, clients/go) against a real server.
test-clients: setup
	@echo "==== client libraries on PostgreSQL $(PG)"
	@bash clients/run.sh $(PG)
# PgQue's published Python client, pgque-py 0.2.2, against pgque (compat/).
test-compat: setup
	@echo "==== PgQue compatibility tier (pgque-py 0.2.2) on PostgreSQL $(PG)"
	@bash compat/pgque_py/run.sh $(PG)

# The held-xmin soak: too long for make test (~8 minutes); see scripts/soak.sh.
soak: setup
	@bash scripts/soak.sh $(PG)

# ---- packages ----------------------------------------------------------------
# postgresql-<major>-pgque_<version>_amd64.deb and a tarball per major, and
# META.json, from release builds (scripts/package.sh; docs/install.md).
PKG_VERSIONS ?= $(VERSIONS)
package: setup
	@bash scripts/package.sh --release $(PKG_VERSIONS)

# The package tier: install, upgrade from 0.8.0 and remove postgresql-15-pgque
# with apt-get on Debian's PostgreSQL 15. Last in make test: it takes the
# shared /usr/lib/postgresql/15 and reinstalls the dev build when it is done.
test-package: setup
	@echo "==== package tier on Debian's PostgreSQL 15"
	@bash scripts/test_package.sh

# ---- a local server -----------------------------------------------------------
run: setup
	@bash scripts/run.sh start $(PG)

stop:
	@bash scripts/run.sh stop $(PG)

psql:
	@bash scripts/run.sh psql $(PG)

# A router and two shards on this machine (docs/scale-out.md); PostgreSQL 15.
cluster: setup
	@bash scripts/cluster.sh start

cluster-stop:
	@bash scripts/cluster.sh stop

# ---- benchmarks ---------------------------------------------------------------
bench: setup
	@bash benches/run.sh
