"""Connections and the measurements every workload shares.

- connect(): a psycopg connection to the bench database (env from benches/run.sh);
- has_function(): feature detection, so a workload whose pgque functions are not
  installed yet is skipped with a clear line instead of faking a number;
- wal_lsn()/wal_diff(): WAL bytes written (pg_current_wal_insert_lsn difference);
- dead_tuples(): n_dead_tup per table of the schemas a system owns;
- pgss_*(): pg_stat_statements reset and statements-per-call.
"""
import os
import time

import psycopg

HOST = os.environ.get("BENCH_HOST", "/tmp/pgque_bench")
PORT = int(os.environ.get("BENCH_PORT", "55515"))
DB = os.environ.get("BENCH_DB", "pgque_bench")
USER = "postgres"

# The ~200-byte JSON payload, built server-side from an integer expression `n`
# (the same expression for every system, so building it costs them all the same).
PAYLOAD_SQL = (
    "jsonb_build_object('id', {n}, 'ts', clock_timestamp(), 'kind', 'order.created', "
    "'customer', 'cust-000042', 'amount', 129.95, 'currency', 'EUR', 'items', 3, "
    "'note', repeat('x', 64))"
)


def payload_sql(n="1"):
    return PAYLOAD_SQL.format(n=n)


def conninfo(dbname=DB):
    return f"host={HOST} port={PORT} dbname={dbname} user={USER} application_name=pgque_bench"


def connect(autocommit=True, dbname=DB):
    return psycopg.connect(conninfo(dbname), autocommit=autocommit)


def scalar(conn, sql, params=None):
    with conn.cursor() as cur:
        cur.execute(sql, params)
        row = cur.fetchone()
        return None if row is None else row[0]


def one(conn, sql, params=None):
    """The first row of a query (a tuple), or None."""
    with conn.cursor() as cur:
        cur.execute(sql, params)
        return cur.fetchone()


def execute(conn, sql, params=None):
    with conn.cursor() as cur:
        cur.execute(sql, params)


def truncate(conn, table):
    """TRUNCATE, then flush this backend's statistics at once: a TRUNCATE's pending
    stats reset n_dead_tup when they are flushed, which for an idle backend can be
    seconds later, after the workload's own counts (wiping them)."""
    execute(conn, f"TRUNCATE {table}")
    execute(conn, "SELECT pg_stat_force_next_flush()")
    execute(conn, "SELECT 1")


def vacuum_schemas(conn, schemas):
    """Harness housekeeping between cells (never inside one): VACUUM the tables of
    the given schemas, so the dead tuples a cell reports are its own and not those
    left by the previous cell's drop_queue. The drop's own pending statistics are
    flushed first, or they would land after VACUUM's and count again."""
    execute(conn, "SELECT pg_stat_force_next_flush()")
    execute(conn, "SELECT 1")
    with conn.cursor() as cur:
        cur.execute("SELECT format('%%I.%%I', schemaname, relname) FROM pg_stat_user_tables WHERE schemaname = ANY(%s)",
                    (list(schemas),))
        names = [r[0] for r in cur.fetchall()]
    for n in names:
        execute(conn, f"VACUUM {n}")
    execute(conn, "SELECT pg_stat_force_next_flush()")
    execute(conn, "SELECT 1")


def has_function(conn, signature):
    """True when e.g. 'pgque.send(text,jsonb)' exists (to_regprocedure)."""
    return scalar(conn, "SELECT to_regprocedure(%s) IS NOT NULL", (signature,))


def missing_functions(conn, signatures):
    return [s for s in signatures if not has_function(conn, s)]


def wal_lsn(conn):
    return scalar(conn, "SELECT pg_current_wal_insert_lsn()::text")


def wal_diff(conn, start_lsn):
    return int(scalar(conn, "SELECT pg_wal_lsn_diff(pg_current_wal_insert_lsn(), %s::pg_lsn)", (start_lsn,)))


# Which schemas hold each system's tables.
SYSTEM_SCHEMAS = {
    "pgque": ("pgque", "pgque_data", "pgque_events", "pgque_jobs"),
    "pgq": ("pgq", "pgq_node", "pgq_ext"),
    "plain": ("bench",),
    "skiplocked": ("bench",),
}


def dead_tuples(conn, schemas, tables=None, settle=0.6):
    """{schema.table: n_dead_tup} for tables with dead tuples or live rows, in the given schemas.

    Backends flush their table statistics at exit and at most once a second while
    running, so wait a little and drop the cached stats snapshot first.
    """
    if settle:
        time.sleep(settle)
    with conn.cursor() as cur:
        cur.execute("SELECT pg_stat_clear_snapshot()")
        cur.execute(
            "SELECT schemaname || '.' || relname, n_dead_tup, n_live_tup FROM pg_stat_user_tables "
            "WHERE schemaname = ANY(%s) ORDER BY 1",
            (list(schemas),),
        )
        out = {}
        for name, dead, live in cur.fetchall():
            if tables is not None and name not in tables:
                continue
            if dead or live:
                out[name] = int(dead)
        return out


def pgss_reset(conn):
    execute(conn, "SELECT pg_stat_statements_reset()")


def pgss_statements_per_call(conn, marker):
    """(top-level calls of statements containing `marker`, nested statements per such call).

    Counts every statement pg_stat_statements saw in the bench database (top-level
    and nested, track = all) except the harness's own bookkeeping, divided by the
    number of top-level calls of the workload statement. Run with the pgque worker
    stopped, so nothing else executes statements in the database.
    """
    with conn.cursor() as cur:
        cur.execute(
            """
            WITH s AS (
              SELECT s.query, s.calls, s.toplevel
                FROM pg_stat_statements s JOIN pg_database d ON d.oid = s.dbid
               WHERE d.datname = current_database()
                 AND s.query NOT ILIKE '%%pg_stat_statements%%'
                 AND s.query NOT ILIKE '%%pg_current_wal%%'
                 AND s.query NOT ILIKE '%%pg_stat_user_tables%%'
                 AND s.query NOT ILIKE '%%pg_stat_clear_snapshot%%'
            )
            SELECT coalesce(sum(calls) FILTER (WHERE toplevel AND query ILIKE %s), 0),
                   coalesce(sum(calls), 0)
              FROM s
            """,
            ("%" + marker + "%",),
        )
        top, total = cur.fetchone()
    top, total = int(top), int(total)
    return top, ((total - top) / top if top else None)


def settings(conn):
    names = [
        "server_version", "shared_buffers", "synchronous_commit", "wal_level", "max_wal_size",
        "checkpoint_timeout", "jit", "fsync", "full_page_writes", "wal_compression",
        "shared_preload_libraries", "pg_stat_statements.track", "autovacuum",
        "autovacuum_naptime", "max_connections",
    ]
    with conn.cursor() as cur:
        cur.execute("SELECT name, current_setting(name), NULL FROM pg_settings WHERE name = ANY(%s) OR name LIKE 'pgque.%%' ORDER BY name", (names,))
        rows = cur.fetchall()
        cur.execute("SELECT version()")
        ver = cur.fetchone()[0]
        cur.execute("SELECT extname, extversion FROM pg_extension ORDER BY 1")
        exts = cur.fetchall()
        cur.execute(f"SELECT octet_length(({payload_sql('123456')})::text)")
        plen = cur.fetchone()[0]
    return ver, rows, exts, plen


def pgss_top(conn, n=6):
    """The statements that took the most time since the last reset, in the bench
    database, top-level and nested: a first profile of a cell."""
    with conn.cursor() as cur:
        cur.execute(
            """
            SELECT s.toplevel, s.calls, s.total_exec_time, s.rows,
                   (s.shared_blks_hit + s.shared_blks_read)::float8 / greatest(s.calls, 1),
                   regexp_replace(left(s.query, 160), '\\s+', ' ', 'g')
              FROM pg_stat_statements s JOIN pg_database d ON d.oid = s.dbid
             WHERE d.datname = current_database()
               AND s.query NOT ILIKE '%%pg_stat_statements%%' AND s.query NOT ILIKE '%%pg_current_wal%%'
               AND s.query NOT ILIKE '%%pg_stat_user_tables%%' AND s.query NOT ILIKE '%%pg_stat_clear_snapshot%%'
               AND s.query NOT ILIKE '%%pg_stat_force_next_flush%%'
             ORDER BY s.total_exec_time DESC LIMIT %s
            """, (n,))
        return cur.fetchall()
