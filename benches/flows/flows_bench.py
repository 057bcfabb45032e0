"""Flows at scale (issue 19); run by flows_bench.sh, which says what it measures.

Every figure is client-side time (time.perf_counter around one statement);
systems alternate within each round and the claims are the ratios per round.
"""
import os
import statistics
import sys
import threading
import time

import psycopg

DSN = os.environ["FLOWBENCH_DSN"]
ROUNDS = int(os.environ.get("ROUNDS", "3"))
SINGLE = 200  # completions per system and round, one completer
PAIR = 200  # completions per completer and round, two completers
SAMPLES = 200  # dispatch calls per cell (after 3 warm-ups)
LIMIT = 50
WIDE = 9998  # the middle of 1 -> 9,998 -> 1: a flow of 10,000 jobs
NARROW_FLOWS = ROUNDS * (SINGLE + 2 * PAIR) // 2 + 50
READY = 10000  # ready jobs in each dispatch queue
WAITING = 100000  # waiting jobs added to each dispatch queue


def log(msg):
    print(f"[flows {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def connect(autocommit=True):
    return psycopg.connect(DSN, autocommit=autocommit)


def pct(xs, p):
    xs = sorted(xs)
    k = max(0, min(len(xs) - 1, int(round(p / 100.0 * len(xs) + 0.5)) - 1))
    return xs[k]


def one(conn, sql, params=None):
    row = conn.execute(sql, params).fetchone()
    return None if row is None else row[0]


def fan_json(key_prefix, mids):
    """SQL for the JSON of a flow r -> mids x mid -> s."""
    return f"""
      jsonb_build_array(jsonb_build_object('key', 'r', 'kind', 'root'))
      || (SELECT jsonb_agg(jsonb_build_object('key', 'm' || g, 'kind', 'mid',
                                              'depends_on', jsonb_build_array('r')))
          FROM generate_series(1, {mids}) g)
      || jsonb_build_array(jsonb_build_object('key', 's', 'kind', 'sink',
             'depends_on', (SELECT jsonb_agg('m' || g) FROM generate_series(1, {mids}) g)))"""


# ---- a: completion vs siblings --------------------------------------------------------------
def setup_completion(c):
    for q in ("fwide", "fnarrow"):
        c.execute("SELECT pgque.create_job_queue(%s)", (q,))
    t0 = time.perf_counter()
    c.execute(f"SELECT count(*) FROM pgque.enqueue_flow('fwide', {fan_json('w', WIDE)})")
    enq_ms = (time.perf_counter() - t0) * 1000
    c.execute(f"""DO $$ BEGIN
        FOR i IN 1..{NARROW_FLOWS} LOOP
          PERFORM count(*) FROM pgque.enqueue_flow('fnarrow', {fan_json('n', 2)});
        END LOOP; END $$""")
    # the roots: dispatched and completed, so the middles are ready
    t0 = time.perf_counter()
    ids, toks = c.execute("SELECT array_agg(job_id), array_agg(lease_token) FROM pgque.dispatch(ARRAY['fwide'], 1, 'setup')").fetchone()
    c.execute("SELECT pgque.complete_many(%s, %s)", (ids, toks))
    root_ms = (time.perf_counter() - t0) * 1000
    # only the roots are ready until one completes: one dispatch takes them all
    ids, toks = c.execute("SELECT array_agg(job_id), array_agg(lease_token) FROM pgque.dispatch(ARRAY['fnarrow'], %s, 'setup')", (NARROW_FLOWS,)).fetchone()
    assert len(ids) == NARROW_FLOWS
    c.execute("SELECT pgque.complete_many(%s, %s)", (ids, toks))
    c.execute("VACUUM ANALYZE pgque.jobs")
    c.execute("VACUUM ANALYZE pgque.job_deps")
    return enq_ms, root_ms


def take(c, q, n):
    rows = c.execute("SELECT job_id, lease_token, kind FROM pgque.dispatch(ARRAY[%s], %s, 'bench', interval '1 hour')", (q, n)).fetchall()
    assert rows and all(r[2] == "mid" for r in rows), (q, rows[:3])
    return [(r[0], r[1]) for r in rows]


def complete_all(jobs, lats):
    c = connect()
    cur = c.cursor()
    for jid, tok in jobs:
        t0 = time.perf_counter()
        ok = cur.execute("SELECT pgque.complete(%s, %s)", (jid, tok), prepare=True).fetchone()[0]
        lats.append((time.perf_counter() - t0) * 1000)
        assert ok, jid
    c.close()


def completion(c):
    enq_ms, root_ms = setup_completion(c)
    systems = [("9,997 siblings (flow of 10,000)", "fwide"), ("1 sibling (flow of 4)", "fnarrow")]
    single = {s: [] for s, _ in systems}
    pair = {s: [] for s, _ in systems}
    for rnd in range(ROUNDS):
        order = systems if rnd % 2 == 0 else systems[::-1]
        for name, q in order:
            lats = []
            complete_all(take(c, q, SINGLE), lats)
            single[name].append((pct(lats, 50), pct(lats, 95)))
            log(f"a round {rnd + 1} {name} one completer p50 {pct(lats, 50):.3f} ms")
        for name, q in order:
            jobs = [take(c, q, PAIR), take(c, q, PAIR)]
            lats = [[], []]
            ts = [threading.Thread(target=complete_all, args=(jobs[i], lats[i])) for i in range(2)]
            t0 = time.perf_counter()
            for t in ts:
                t.start()
            for t in ts:
                t.join()
            secs = time.perf_counter() - t0
            pair[name].append((2 * PAIR / secs, pct(lats[0] + lats[1], 50)))
            log(f"a round {rnd + 1} {name} two completers {2 * PAIR / secs:.0f}/s")
    # exactness: the fan-in child counts exactly the middles not completed,
    # then becomes ready with the last of them, once
    done = one(c, "SELECT count(*) FROM pgque.jobs WHERE queue = 'fwide' AND kind = 'mid' AND state = 'completed'")
    sink = c.execute("SELECT state, pending_parents FROM pgque.jobs WHERE queue = 'fwide' AND kind = 'sink'").fetchone()
    assert sink == ("waiting", WIDE - done), (sink, done)
    # the other middles, dispatched at once (the sink cannot be ready yet),
    # completed 1,000 at a time
    ids, toks = c.execute("SELECT array_agg(job_id), array_agg(lease_token) FROM pgque.dispatch(ARRAY['fwide'], %s, 'drain', interval '1 hour')", (WIDE - done,)).fetchone()
    assert len(ids) == WIDE - done
    t_last = None
    for i in range(0, len(ids), 1000):
        t0 = time.perf_counter()
        c.execute("SELECT pgque.complete_many(%s, %s)", (ids[i:i + 1000], toks[i:i + 1000]))
        t_last = ((time.perf_counter() - t0) * 1000, len(ids[i:i + 1000]))
    sink2 = c.execute("SELECT state, pending_parents FROM pgque.jobs WHERE queue = 'fwide' AND kind = 'sink'").fetchone()
    assert sink2 == ("ready", None), sink2
    woke = one(c, "SELECT count(*) FROM pgque.job_events e, pgque.jobs s WHERE s.queue = 'fwide' AND s.kind = 'sink' "
                  "AND e.queue = 'fwide' AND e.event = 'promoted' AND s.id = ANY (e.job_ids)")
    assert woke == 1, woke

    for q in ("fwide", "fnarrow"):
        c.execute("SELECT pgque.drop_job_queue(%s, true)", (q,))
    print("### a. Completing a child: 9,997 siblings vs 1\n")
    print(f"Setup: `enqueue_flow` of the 10,000-job flow (1 -> 9,998 -> 1) in one call: {enq_ms:.0f} ms; "
          f"completing its root (which readies 9,998 children): {root_ms:.0f} ms. "
          f"{NARROW_FLOWS} flows 1 -> 2 -> 1 for the reference. Each completion is "
          f"`SELECT pgque.complete(id, token)` in its own transaction (autocommit, prepared), "
          f"{SINGLE} per cell with one completer, {PAIR} per completer with two.\n")
    print("| system | " + " | ".join(f"round {r + 1}" for r in range(ROUNDS)) + " | median |")
    print("|---|" + "---|" * (ROUNDS + 1))
    for label, data, i, fmt in [("one completer, p50 ms", single, 0, "{:.3f}"),
                                ("one completer, p95 ms", single, 1, "{:.3f}"),
                                ("two completers, completions/s", pair, 0, "{:.0f}"),
                                ("two completers, p50 ms", pair, 1, "{:.3f}")]:
        for name, _ in systems:
            vals = [v[i] for v in data[name]]
            print(f"| {name}: {label} | " + " | ".join(fmt.format(v) for v in vals)
                  + f" | {fmt.format(statistics.median(vals))} |")
    w, n = systems[0][0], systems[1][0]
    r1 = [a[0] / b[0] for a, b in zip(single[w], single[n])]
    r2 = [a[0] / b[0] for a, b in zip(pair[w], pair[n])]
    print(f"\nratio 9,997 siblings / 1 sibling per round: one completer p50 "
          + ", ".join(f"{x:.2f}" for x in r1) + f" (median {statistics.median(r1):.2f}); "
          + "two completers' rate " + ", ".join(f"{x:.2f}" for x in r2)
          + f" (median {statistics.median(r2):.2f}).\n")
    print(f"Exactness: after {done} single completions the fan-in child was `waiting` with "
          f"pending_parents = {WIDE - done}; the last complete_many ({t_last[1]} middles, "
          f"{t_last[0]:.0f} ms) made it `ready`, one 'parents done' event.\n")


# ---- b: dispatch with waiting jobs ----------------------------------------------------------
def add_waiting(c, q):
    per = 10000
    for _ in range(WAITING // per):
        # a root that runs tomorrow (scheduled), so its 10,000 children wait
        c.execute(f"""SELECT count(*) FROM pgque.enqueue_flow(%s,
            jsonb_build_array(jsonb_build_object('key', 'r', 'kind', 'later',
                                                 'run_at', (now() + interval '1 day')::text))
            || (SELECT jsonb_agg(jsonb_build_object('key', 'c' || g, 'kind', 'waits',
                                                    'depends_on', jsonb_build_array('r')))
                FROM generate_series(1, {per}) g))""", (q,))


def set_waiting(c, on):
    """Brings the dispatch queues to 100,000 waiting jobs each (on) or none."""
    have = one(c, "SELECT count(*) FROM pgque.jobs WHERE state = 'waiting' AND queue IN ('dside', 'dlog')")
    if on and have == 0:
        for q in ("dside", "dlog"):
            add_waiting(c, q)
    elif not on and have > 0:
        c.execute("DELETE FROM pgque.job_deps")
        c.execute("DELETE FROM pgque.jobs WHERE queue IN ('dside', 'dlog') AND state IN ('waiting', 'scheduled')")
    c.execute("VACUUM ANALYZE pgque.jobs")
    c.execute("VACUUM ANALYZE pgque.job_deps")
    n = one(c, "SELECT count(*) FROM pgque.jobs WHERE state = 'waiting' AND queue IN ('dside', 'dlog')")
    st = c.execute("SELECT queue_name, ready, waiting FROM pgque.job_queue_status WHERE queue_name IN ('dside', 'dlog') ORDER BY 1").fetchall()
    log(f"waiting jobs: {n}; status {st}")
    return n


def dispatch_cell(q, plan):
    c = connect(autocommit=False)
    cur = c.cursor()
    cur.execute(f"SET plan_cache_mode = {'force_generic_plan' if plan == 'generic' else 'force_custom_plan'}")
    c.commit()
    lats, rows = [], []
    for i in range(SAMPLES + 3):
        t0 = time.perf_counter()
        got = cur.execute("SELECT job_id, queue, kind, args::text, priority, attempt, lease_token "
                          "FROM pgque.dispatch(%s::text[], %s::int, %s::text, NULL::interval, 2)",
                          ([q], LIMIT, "w"), prepare=True).fetchall()
        t1 = time.perf_counter()
        c.rollback()
        if i >= 3:
            lats.append((t1 - t0) * 1000)
            rows.append(len(got))
    c.close()
    assert min(rows) == LIMIT, (q, plan, min(rows))
    return pct(lats, 50), pct(lats, 95)


def dispatch(c):
    c.execute("SELECT pgque.create_job_queue('dside')")
    c.execute("SELECT pgque.create_job_queue('dlog')")
    # ready jobs in pgque.jobs: a flow of independent jobs (every flow job lives there)
    for _ in range(READY // 10000):
        c.execute("""SELECT count(*) FROM pgque.enqueue_flow('dside',
            (SELECT jsonb_agg(jsonb_build_object('key', 'k' || g, 'kind', 'bench.kind',
                                                 'args', jsonb_build_object('n', g)))
             FROM generate_series(1, 10000) g))""")
    for _ in range(READY // 1000):
        c.execute("""SELECT count(*) FROM pgque.enqueue_ready_rows('dlog',
            array_fill('bench.kind'::text, ARRAY[1000]),
            (SELECT array_agg(jsonb_build_object('n', g)) FROM generate_series(1, 1000) g))""")
    cells = [(q, p) for q in ("dside", "dlog") for p in ("custom", "generic")]
    names = {"dside": "ready in pgque.jobs (flow jobs)", "dlog": "ready in the job log"}
    res = {(q, p, w): [] for q, p in cells for w in (False, True)}
    counts = {}
    for rnd in range(ROUNDS):
        for waiting in ((False, True) if rnd % 2 == 0 else (True, False)):
            counts[waiting] = set_waiting(c, waiting)
            for q, p in cells:
                r = dispatch_cell(q, p)
                res[(q, p, waiting)].append(r)
                log(f"b round {rnd + 1} waiting={waiting} {q} {p}: p50 {r[0]:.3f} p95 {r[1]:.3f}")
    print("### b. Dispatch with 100,000 waiting jobs vs none\n")
    print(f"{READY:,} ready jobs per queue; `pgque.dispatch(ARRAY[q], {LIMIT}, 'w', NULL, 2)`, prepared, "
          f"{SAMPLES} samples per cell after 3 warm-ups, each rolled back (the depth stays). Waiting: "
          f"{counts[True]:,} in all ({WAITING:,} per queue: flows whose root runs tomorrow, so its children wait), "
          f"added and deleted (then VACUUM ANALYZE) between the states, the states alternating per round.\n")
    print("| ready jobs | plan | none p50 / p95 ms per round | 100k waiting p50 / p95 ms per round | p50 ratio per round | median ratio (target <= 1.25) |")
    print("|---|---|---|---|---|---|")
    for q, p in cells:
        a, b = res[(q, p, False)], res[(q, p, True)]
        ratios = [y[0] / x[0] for x, y in zip(a, b)]
        print(f"| {names[q]} | {p} | " + ", ".join(f"{x[0]:.2f} / {x[1]:.2f}" for x in a) + " | "
              + ", ".join(f"{y[0]:.2f} / {y[1]:.2f}" for y in b) + " | "
              + ", ".join(f"{r:.2f}" for r in ratios) + f" | {statistics.median(ratios):.2f} |")
    print()


def main():
    c = connect()
    c.execute("SET client_min_messages = warning")
    print(f"Run of {time.strftime('%Y-%m-%d %H:%M', time.gmtime())} UTC, {ROUNDS} rounds, "
          f"PostgreSQL {one(c, 'SHOW server_version')}, pgque {one(c, 'SELECT extversion FROM pg_extension WHERE extname = %s', ('pgque',))}; "
          f"load average at start {os.getloadavg()[0]:.1f}.\n")
    only = os.environ.get("ONLY", "a,b").split(",")
    if "a" in only:
        completion(c)
    if "b" in only:
        dispatch(c)
    print(f"Load average at the end {os.getloadavg()[0]:.1f}.")


if __name__ == "__main__":
    main()
