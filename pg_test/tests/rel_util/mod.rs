//! Shared by upgrade.rs and dump_restore.rs: a database filled with every
//! kind of pgque state (queues, ticked/consumed/pending events, an open
//! batch, a cooperative consumer, delayed and idempotent sends, job queues
//! with ready/scheduled/running jobs), the check that all of it is still
//! consumable, and a catalogue snapshot of the extension's objects.
#![allow(dead_code)]
use pgque_pg_test::postgres::Client;
use pgque_pg_test::*;
use std::collections::BTreeMap;
use std::time::Duration;

/// What `fill` left behind and `consume_all` must find.
#[derive(Debug, Clone)]
pub struct Filled {
    /// The job dispatched (running) at fill time: (id, lease token).
    pub running_job: (i64, i64),
    /// The id send_idem returned for "key-1".
    pub idem_event: i64,
    /// The id send_at reserved for the delayed event.
    pub delayed_event: i64,
    /// pgque.event_<id>_id_seq's last value at fill time.
    pub event_seq_last: i64,
}

/// Runs each statement in its own transaction (a multi-statement simple
/// query is one transaction: a tick would not see the sends before it).
pub fn run_each(c: &mut Client, stmts: &[&str]) {
    for s in stmts {
        c.batch_execute(s).unwrap_or_else(|e| panic!("{s}: {e:?}"));
    }
}

fn payloads(
    c: &mut Client,
    sql: &str,
    params: &[&(dyn pgque_pg_test::postgres::types::ToSql + Sync)],
) -> Vec<(i64, i64, String)> {
    c.query(sql, params)
        .unwrap()
        .iter()
        .map(|r| {
            (
                r.get::<_, i64>(0),
                r.get::<_, i64>(1),
                r.get::<_, String>(2),
            )
        })
        .collect()
}

/// receive(): [(msg_id, batch_id, payload)].
pub fn receive(c: &mut Client, consumer: &str) -> Vec<(i64, i64, String)> {
    payloads(
        c,
        "SELECT msg_id, batch_id, payload FROM pgque.receive('uq', $1, 1000)",
        &[&consumer],
    )
}

fn receive_coop(c: &mut Client) -> Vec<(i64, i64, String)> {
    payloads(
        c,
        "SELECT msg_id, batch_id, payload FROM pgque.receive_coop('uq', 'coop', 'm1', 1000)",
        &[],
    )
}

fn ack(c: &mut Client, batch: i64) {
    let n: i32 = c
        .query_one("SELECT pgque.ack($1)", &[&batch])
        .unwrap()
        .get(0);
    assert_eq!(n, 1, "ack of batch {batch}");
}

fn one_batch(rows: &[(i64, i64, String)]) -> i64 {
    let b = rows[0].1;
    assert!(
        rows.iter().all(|r| r.1 == b),
        "one batch per receive: {rows:?}"
    );
    b
}

fn texts(rows: &[(i64, i64, String)]) -> Vec<String> {
    rows.iter().map(|r| r.2.clone()).collect()
}

fn ev(range: std::ops::RangeInclusive<i32>) -> Vec<String> {
    range.map(|i| format!("e{i}")).collect()
}

/// Fills the database `c` is connected to (pgque installed, its worker
/// stopped by the caller) with every kind of state. Queue `uq`, consumers
/// c1 (consumed e1..e10, acked), c2 (holds e1..e10 in an open batch), c3
/// (consumed e1..e10, but e2 went to the dead letters and e1 waits an hour
/// in the retry queue), the
/// cooperative consumer coop/m1 (consumed e1..e10); pending for all: e11..e15
/// (ticked), e16 and idem-1 (not ticked), delayed-1 (due in ~2 s, so it is
/// still held when fill returns). Job queue
/// `jq`: r1 running, r2 and r3 ready, s1 scheduled in ~2 s.
/// Fills a database (see the module comment). `jobs_as_0_1_0`: the job rows
/// are written as 0.1.0's (and, on these columns, 0.2.0's) enqueue and
/// dispatch wrote them, because the current library's job functions need the
/// current job store (0.2.0: jobs.rr_key; 0.3.0: job_events.job_ids): they
/// cannot run against an un-updated schema, and the old libraries are not at
/// hand here.
pub fn fill(c: &mut Client, jobs_as_0_1_0: bool) -> Filled {
    run_each(
        c,
        &[
            "SELECT pgque.create_queue('uq')",
            "SELECT pgque.subscribe('uq', 'c1')",
            "SELECT pgque.subscribe('uq', 'c2')",
            "SELECT pgque.subscribe('uq', 'c3')",
            "SELECT pgque.subscribe_subconsumer('uq', 'coop', 'm1')",
            "SELECT pgque.send('uq', 't', 'e' || i) FROM generate_series(1, 10) i",
            "SELECT pgque.force_tick('uq')",
        ],
    );
    let r = receive(c, "c1");
    assert_eq!(texts(&r), ev(1..=10));
    ack(c, one_batch(&r));
    let r = receive(c, "c2");
    assert_eq!(texts(&r), ev(1..=10), "c2 keeps this batch open");
    let r = receive_coop(c);
    assert_eq!(texts(&r), ev(1..=10));
    ack(c, one_batch(&r));
    // c3 sends e2 to the dead letters (max_retries 0 for the moment) and
    // e1 to the retry queue (due in an hour), then acks the rest.
    let r = receive(c, "c3");
    let b3 = one_batch(&r);
    let nack = "SELECT pgque.nack($1, m, interval '1 hour', 'test') \
                  FROM pgque.get_batch_events($1) g, \
                       LATERAL (SELECT ROW(g.ev_id, $1, g.ev_type, g.ev_data, g.ev_retry, g.ev_time, \
                                       g.ev_extra1, g.ev_extra2, g.ev_extra3, g.ev_extra4)::pgque.message AS m) x \
                 WHERE g.ev_data = $2";
    c.execute(
        "SELECT pgque.set_queue_config('uq', 'max_retries', '0')",
        &[],
    )
    .unwrap();
    c.execute(nack, &[&b3, &"e2"]).unwrap();
    c.execute(
        "SELECT pgque.set_queue_config('uq', 'max_retries', '5')",
        &[],
    )
    .unwrap();
    c.execute(nack, &[&b3, &"e1"]).unwrap();
    ack(c, b3);
    let (dl, rq): (i64, i64) = {
        let r = c
            .query_one(
                "SELECT (SELECT count(*) FROM pgque.dead_letter), (SELECT count(*) FROM pgque.retry_queue)",
                &[],
            )
            .unwrap();
        (r.get(0), r.get(1))
    };
    assert_eq!(
        (dl, rq),
        (1, 1),
        "one dead letter, one event waiting for retry"
    );
    run_each(
        c,
        &[
            "SELECT pgque.send('uq', 't', 'e' || i) FROM generate_series(11, 15) i",
            "SELECT pgque.force_tick('uq')",
            "SELECT pgque.send('uq', 't', 'e16')",
        ],
    );
    let idem_event: i64 = c
        .query_one(
            "SELECT event_id FROM pgque.send_idem('uq', 't', 'idem-1', 'key-1', '1 hour')",
            &[],
        )
        .unwrap()
        .get(0);
    let delayed_event: i64 = c
        .query_one(
            "SELECT pgque.send_at('uq', 't', 'delayed-1', clock_timestamp() + interval '2 seconds')",
            &[],
        )
        .unwrap()
        .get(0);
    // Jobs: r1 dispatched (running), r2 r3 ready, s1 scheduled.
    let running_job = if jobs_as_0_1_0 {
        jobs_rows_as_0_1_0(c)
    } else {
        run_each(
            c,
            &[
                "SELECT pgque.create_job_queue('jq')",
                "SELECT pgque.enqueue('jq', 'r1', '{\"n\": 1}')",
                "SELECT pgque.enqueue('jq', 'r2', '{\"n\": 2}', actor => 'acme')",
                "SELECT pgque.enqueue('jq', 'r3', '{\"n\": 3}')",
                "SELECT pgque.enqueue('jq', 's1', '{\"n\": 4}', run_at => clock_timestamp() + interval '2 seconds')",
            ],
        );
        let row = c
            .query_one(
                "SELECT job_id, lease_token, kind FROM pgque.dispatch(ARRAY['jq'], 1, 'w1', interval '1 hour')",
                &[],
            )
            .unwrap();
        assert_eq!(row.get::<_, String>(2), "r1");
        (row.get(0), row.get(1))
    };
    let st: (i64, i64, i64) = {
        let r = c
            .query_one(
                "SELECT ready, scheduled, running FROM pgque.job_queue_status WHERE queue_name = 'jq'",
                &[],
            )
            .unwrap();
        (r.get(0), r.get(1), r.get(2))
    };
    assert_eq!(st, (2, 1, 1), "ready, scheduled, running after fill");
    let held: i64 = c
        .query_one(
            "SELECT count(*) FROM pgque.delayed_event WHERE ev_data = 'delayed-1' \
              AND NOT EXISTS (SELECT 1 FROM pgque.event_1 WHERE ev_data = 'delayed-1')",
            &[],
        )
        .unwrap()
        .get(0);
    assert_eq!(held, 1, "the delayed event is still held when fill returns");
    let event_seq_last: i64 = c
        .query_one("SELECT last_value FROM pgque.event_1_id_seq", &[])
        .unwrap()
        .get(0);
    Filled {
        running_job,
        idem_event,
        delayed_event,
        event_seq_last,
    }
}

/// Ticks, then receives and acks until empty; returns the payloads.
fn drain(c: &mut Client, consumer: &str) -> Vec<String> {
    c.batch_execute("SELECT pgque.force_tick('uq')").unwrap();
    let mut all = vec![];
    loop {
        let r = if consumer == "coop" {
            receive_coop(c)
        } else {
            receive(c, consumer)
        };
        if r.is_empty() {
            return all;
        }
        all.extend(texts(&r));
        ack(c, one_batch(&r));
    }
}

/// Everything `fill` left pending is delivered exactly once to each
/// consumer and every job runs to completion; new sends work too.
pub fn consume_all(c: &mut Client, f: &Filled) {
    // Idempotency keys survived: the same key is a duplicate.
    let r = c
        .query_one(
            "SELECT event_id, deduped FROM pgque.send_idem('uq', 't', 'idem-1', 'key-1', '1 hour')",
            &[],
        )
        .unwrap();
    assert_eq!(
        (r.get::<_, i64>(0), r.get::<_, bool>(1)),
        (f.idem_event, true),
        "send_idem of an already claimed key"
    );
    // The delayed event is promoted once due (by this call, or by a worker
    // that ran meanwhile), with the id send_at reserved.
    c.batch_execute(
        "SELECT pg_sleep(greatest(0, extract(epoch FROM max(d.deliver_at) - clock_timestamp()) + 0.05)::float8)
           FROM pgque.delayed_event d",
    )
    .unwrap();
    let promoted = wait_until(Duration::from_secs(10), || {
        c.batch_execute("SELECT pgque.maint_delayed()").unwrap();
        c.query_one(
            "SELECT count(*) FROM pgque.event_1 WHERE ev_data = 'delayed-1'",
            &[],
        )
        .unwrap()
        .get::<_, i64>(0)
            == 1
    });
    assert!(promoted, "the delayed event was not promoted");
    let id: i64 = c
        .query_one(
            "SELECT ev_id FROM pgque.event_1 WHERE ev_data = 'delayed-1'",
            &[],
        )
        .unwrap()
        .get(0);
    assert_eq!(
        id, f.delayed_event,
        "the delayed event keeps its reserved id"
    );
    // Event ids continue after the old ones (the sequence kept its value).
    let new_id: i64 = c
        .query_one("SELECT pgque.send('uq', 't', 'after')", &[])
        .unwrap()
        .get(0);
    assert!(
        new_id > f.event_seq_last,
        "new event id {new_id} must follow the old ones (last {})",
        f.event_seq_last
    );
    let mut pending: Vec<String> = ev(11..=16);
    pending.extend(["idem-1", "delayed-1", "after"].map(String::from));
    pending.sort();

    // c2's open batch comes back first, whole.
    let r = receive(c, "c2");
    assert_eq!(texts(&r), ev(1..=10), "c2's open batch is delivered again");
    ack(c, one_batch(&r));
    // Then each consumer gets exactly what it had not consumed, once.
    for consumer in ["c1", "c2", "c3", "coop"] {
        let mut got = drain(c, consumer);
        got.sort();
        assert_eq!(got, pending, "pending events of {consumer}");
    }

    // c3's dead letter and its retry (still an hour away) are there.
    let dl: Vec<String> = c
        .query("SELECT ev_data FROM pgque.dlq_inspect('uq')", &[])
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(dl, ["e2"], "dead letters");
    let rq: i64 = c
        .query_one(
            "SELECT count(*) FROM pgque.retry_queue WHERE ev_data = 'e1' AND ev_retry_after > now() + interval '50 minutes'",
            &[],
        )
        .unwrap()
        .get(0);
    assert_eq!(rq, 1, "e1 waits for its retry");

    // Jobs: the running one reports progress and completes with an output
    // (0.7.0) under its old lease; the others dispatch.
    let ok: bool = c
        .query_one(
            "SELECT pgque.set_progress($1, $2, '{\"step\": 1}')",
            &[&f.running_job.0, &f.running_job.1],
        )
        .unwrap()
        .get(0);
    assert!(ok, "set_progress() of the job running before");
    let ok: bool = c
        .query_one(
            "SELECT pgque.complete($1, $2, '{\"out\": 1}')",
            &[&f.running_job.0, &f.running_job.1],
        )
        .unwrap()
        .get(0);
    assert!(ok, "complete() of the job running before");
    let shown: String = c
        .query_one(
            "SELECT state || ' ' || output::text || ' ' || progress::text FROM pgque.get_job($1)",
            &[&f.running_job.0],
        )
        .unwrap()
        .get(0);
    assert_eq!(
        shown, r#"completed {"out": 1} {"step": 1}"#,
        "output and progress of the job running before"
    );
    c.batch_execute(
        "SELECT pg_sleep(greatest(0, extract(epoch FROM run_at - clock_timestamp()) + 0.05)::float8)
           FROM pgque.jobs WHERE state = 'scheduled'",
    )
    .unwrap();
    // Promoted by this call or by a worker that ran meanwhile.
    c.batch_execute("SELECT pgque.promote_scheduled_jobs()")
        .unwrap();
    let st: String = c
        .query_one("SELECT state FROM pgque.jobs WHERE kind = 's1'", &[])
        .unwrap()
        .get(0);
    assert_eq!(st, "ready", "the scheduled job is promoted once due");
    // New ordinary jobs go to the job log (0.4.0) and are dispatched after
    // the older jobs that pgque.jobs holds: one FIFO over both stores.
    c.batch_execute(
        "SELECT count(*) FROM pgque.enqueue_ready_rows('jq', ARRAY['n1', 'n2'], ARRAY['{}', '{}']::jsonb[])",
    )
    .unwrap();
    let rows = c
        .query(
            "SELECT job_id, lease_token, kind FROM pgque.dispatch(ARRAY['jq'], 10, 'w2')",
            &[],
        )
        .unwrap();
    let kinds: Vec<String> = rows.iter().map(|r| r.get(2)).collect();
    assert_eq!(
        kinds,
        vec!["r2", "r3", "s1", "n1", "n2"],
        "dispatch order after the change"
    );
    for r in &rows {
        let ok: bool = c
            .query_one(
                "SELECT pgque.complete($1, $2)",
                &[&r.get::<_, i64>(0), &r.get::<_, i64>(1)],
            )
            .unwrap()
            .get(0);
        assert!(ok);
    }
    let r = c
        .query_one(
            "SELECT completed, ready, scheduled, running FROM pgque.job_queue_status WHERE queue_name = 'jq'",
            &[],
        )
        .unwrap();
    assert_eq!(
        (
            r.get::<_, i64>(0),
            r.get::<_, i64>(1),
            r.get::<_, i64>(2),
            r.get::<_, i64>(3)
        ),
        (6, 0, 0, 0),
        "completed, ready, scheduled, running at the end"
    );
}

/// The catalogue definition of every object of the extension, keyed by a
/// readable name: membership (pg_describe_object over pg_depend), functions
/// (pg_get_functiondef, settings, security, volatility, strictness, ACL),
/// relations (kind, options, ACL, partitioning), columns (position among the
/// live ones, type, NOT NULL, default, identity, collation), constraints,
/// indexes (pg_get_indexdef), views (pg_get_viewdef), sequences, composite
/// types, triggers, comments, the schema's ACL and the pg_dump registrations.
/// A function's or relation's ACL is compared with NULL read as the
/// default it stands for (the owner's rights only): pg_upgrade from 15 on
/// restores an explicit owner-only ACL, which is the default, as NULL.
pub fn snapshot(c: &mut Client) -> BTreeMap<String, String> {
    const Q: &str = r#"
WITH ext AS (SELECT * FROM pg_extension WHERE extname = 'pgque'),
mem AS (SELECT d.classid, d.objid, d.objsubid FROM pg_depend d, ext
         WHERE d.refclassid = 'pg_extension'::regclass AND d.refobjid = ext.oid AND d.deptype = 'e'),
rels AS (SELECT c.* FROM pg_class c JOIN mem ON mem.classid = 'pg_class'::regclass AND mem.objid = c.oid)
SELECT 'member ' || pg_describe_object(classid, objid, objsubid), 'member' FROM mem
UNION ALL
SELECT 'function ' || p.oid::regprocedure::text,
       concat_ws(E'\n', pg_get_functiondef(p.oid),
         'proconfig=' || coalesce(array_to_string(p.proconfig, ' | '), '-'),
         'secdef=' || p.prosecdef, 'volatile=' || p.provolatile::text, 'strict=' || p.proisstrict,
         'parallel=' || p.proparallel::text, 'leakproof=' || p.proleakproof, 'cost=' || p.procost,
         'rows=' || p.prorows, 'kind=' || p.prokind::text, 'owner=' || p.proowner::regrole,
         'acl=' || coalesce((SELECT string_agg(a::text, ',' ORDER BY a::text)
                               FROM unnest(coalesce(p.proacl, acldefault('f', p.proowner))) a), '-'))
  FROM pg_proc p JOIN mem ON mem.classid = 'pg_proc'::regclass AND mem.objid = p.oid
UNION ALL
SELECT 'relation ' || r.oid::regclass::text,
       concat_ws(E'\n', 'kind=' || r.relkind::text, 'persistence=' || r.relpersistence::text,
         'options=' || coalesce((SELECT string_agg(o, ',' ORDER BY o) FROM unnest(r.reloptions) o), '-'),
         'acl=' || coalesce((SELECT string_agg(a::text, ',' ORDER BY a::text)
                               FROM unnest(coalesce(r.relacl, acldefault((CASE WHEN r.relkind = 'S' THEN 's' ELSE 'r' END)::"char",
                                                                         r.relowner))) a), '-'),
         'owner=' || r.relowner::regrole, 'rls=' || r.relrowsecurity,
         'partkey=' || coalesce(pg_get_partkeydef(r.oid), '-'),
         'partbound=' || coalesce(pg_get_expr(r.relpartbound, r.oid), '-'),
         'parents=' || coalesce((SELECT string_agg(i.inhparent::regclass::text, ',' ORDER BY i.inhseqno)
                                   FROM pg_inherits i WHERE i.inhrelid = r.oid), '-'),
         'view=' || coalesce(CASE WHEN r.relkind IN ('v', 'm') THEN pg_get_viewdef(r.oid) END, '-'))
  FROM rels r
UNION ALL
SELECT 'column ' || r.oid::regclass::text || '.' || a.attname,
       concat_ws(' ', 'pos=' || row_number() OVER (PARTITION BY r.oid ORDER BY a.attnum),
         format_type(a.atttypid, a.atttypmod), CASE WHEN a.attnotnull THEN 'NOT NULL' END,
         'default=' || coalesce(pg_get_expr(ad.adbin, ad.adrelid), '-'),
         'identity=' || a.attidentity::text, 'generated=' || a.attgenerated::text,
         'collation=' || coalesce(a.attcollation::regcollation::text, '-'),
         'acl=' || coalesce((SELECT string_agg(x::text, ',' ORDER BY x::text) FROM unnest(a.attacl) x), 'default'))
  FROM rels r JOIN pg_attribute a ON a.attrelid = r.oid AND a.attnum > 0 AND NOT a.attisdropped
  LEFT JOIN pg_attrdef ad ON ad.adrelid = r.oid AND ad.adnum = a.attnum
UNION ALL
SELECT 'constraint ' || r.oid::regclass::text || '.' || co.conname,
       pg_get_constraintdef(co.oid) || ' deferrable=' || co.condeferrable || ' valid=' || co.convalidated
  FROM rels r JOIN pg_constraint co ON co.conrelid = r.oid
 -- NOT NULL (a constraint row of its own from PostgreSQL 18 on, whose name
 -- pg_upgrade gives partitions differently): the columns' attnotnull says it
 WHERE co.contype <> 'n'
UNION ALL
SELECT 'index ' || i.indexrelid::regclass::text,
       concat_ws(E'\n', pg_get_indexdef(i.indexrelid),
         'options=' || coalesce((SELECT string_agg(o, ',' ORDER BY o) FROM pg_class ic, unnest(ic.reloptions) o
                                   WHERE ic.oid = i.indexrelid), '-'),
         'primary=' || i.indisprimary, 'clustered=' || i.indisclustered)
  FROM rels r JOIN pg_index i ON i.indrelid = r.oid
UNION ALL
SELECT 'trigger ' || r.oid::regclass::text || '.' || t.tgname, pg_get_triggerdef(t.oid)
  FROM rels r JOIN pg_trigger t ON t.tgrelid = r.oid AND NOT t.tgisinternal
UNION ALL
SELECT 'sequence ' || s.seqrelid::regclass::text,
       concat_ws(' ', format_type(s.seqtypid, NULL), 'start=' || s.seqstart, 'inc=' || s.seqincrement,
         'max=' || s.seqmax, 'min=' || s.seqmin, 'cache=' || s.seqcache, 'cycle=' || s.seqcycle,
         'owned_by=' || coalesce((SELECT pg_describe_object(d.refclassid, d.refobjid, d.refobjsubid)
                                    FROM pg_depend d WHERE d.classid = 'pg_class'::regclass
                                     AND d.objid = s.seqrelid AND d.deptype IN ('a', 'i')), '-'))
  FROM rels r JOIN pg_sequence s ON s.seqrelid = r.oid
UNION ALL
SELECT 'type ' || t.oid::regtype::text,
       concat_ws(E'\n', 'typtype=' || t.typtype::text,
         (SELECT string_agg(a.attname || ' ' || format_type(a.atttypid, a.atttypmod), ', ' ORDER BY a.attnum)
            FROM pg_attribute a WHERE a.attrelid = t.typrelid AND a.attnum > 0 AND NOT a.attisdropped),
         'acl=' || coalesce((SELECT string_agg(a::text, ',' ORDER BY a::text) FROM unnest(t.typacl) a), 'default'))
  FROM pg_type t JOIN mem ON mem.classid = 'pg_type'::regclass AND mem.objid = t.oid
UNION ALL
SELECT 'comment ' || pg_describe_object(mem.classid, mem.objid, mem.objsubid), d.description
  FROM mem JOIN pg_description d ON d.classoid = mem.classid AND d.objoid = mem.objid
UNION ALL
SELECT 'schema ' || n.nspname,
       'owner=' || n.nspowner::regrole || ' acl=' ||
       coalesce((SELECT string_agg(a::text, ',' ORDER BY a::text) FROM unnest(n.nspacl) a), 'default')
  FROM pg_namespace n, ext WHERE n.oid = ext.extnamespace
UNION ALL
SELECT 'extension', 'version=' || extversion || ' relocatable=' || extrelocatable || ' owner=' || extowner::regrole FROM ext
UNION ALL
SELECT 'pg_dump registration ' || cfg::regclass::text, coalesce(cond, '-')
  FROM ext, unnest(ext.extconfig, ext.extcondition) AS u(cfg, cond)
"#;
    c.query(Q, &[])
        .unwrap()
        .iter()
        .map(|r| (r.get::<_, String>(0), r.get::<_, String>(1)))
        .collect()
}

/// Every difference between two snapshots, one paragraph each; empty when
/// equal.
pub fn diff(
    a_name: &str,
    a: &BTreeMap<String, String>,
    b_name: &str,
    b: &BTreeMap<String, String>,
) -> String {
    let mut out = String::new();
    for (k, v) in a {
        match b.get(k) {
            None => out.push_str(&format!(
                "only in {a_name}: {k}\n    {}\n",
                v.replace('\n', "\n    ")
            )),
            Some(w) if w != v => {
                out.push_str(&format!("differs: {k}\n"));
                let (va, vb): (Vec<&str>, Vec<&str>) = (v.lines().collect(), w.lines().collect());
                for i in 0..va.len().max(vb.len()) {
                    let (x, y) = (
                        va.get(i).copied().unwrap_or(""),
                        vb.get(i).copied().unwrap_or(""),
                    );
                    if x != y {
                        out.push_str(&format!("  {a_name}: {x}\n  {b_name}: {y}\n"));
                    }
                }
            }
            _ => {}
        }
    }
    for (k, v) in b {
        if !a.contains_key(k) {
            out.push_str(&format!(
                "only in {b_name}: {k}\n    {}\n",
                v.replace('\n', "\n    ")
            ));
        }
    }
    out
}

/// The job rows 0.1.0 left behind for: create_job_queue('jq'); enqueue r1,
/// r2 (actor 'acme'), r3 and s1 (run_at in 2 s); dispatch(['jq'], 1, 'w1',
/// '1 hour') taking r1. Mirrors 0.1.0's statements (git show
/// 8f5549c:src/jobs/enqueue.rs, dispatch.rs): ids from jobs_id_seq, ready_seq
/// = id, job_events 'enqueued'/'scheduled'/'dispatched', an actor row with its
/// running count. The queue's rows too, as create_job_queue wrote them up to
/// 0.3.0 (the current one also creates the job log's lanes). Returns r1's
/// (id, lease token).
fn jobs_rows_as_0_1_0(c: &mut Client) -> (i64, i64) {
    run_each(
        c,
        &[
            "INSERT INTO pgque.job_queues (queue_name) VALUES ('jq')",
            "INSERT INTO pgque.job_rr_cursors (queue_name) VALUES ('jq')",
            "INSERT INTO pgque.job_actors (actor) VALUES ('acme')",
            "WITH n AS (SELECT nextval('pgque.jobs_id_seq') AS id, k.kind, k.args, k.actor, k.sched, k.ord \
                          FROM (VALUES ('r1', '{\"n\": 1}'::jsonb, NULL::text, false, 1), \
                                       ('r2', '{\"n\": 2}', 'acme', false, 2), \
                                       ('r3', '{\"n\": 3}', NULL, false, 3), \
                                       ('s1', '{\"n\": 4}', NULL, true, 4)) k(kind, args, actor, sched, ord) \
                         ORDER BY k.ord), \
                  ins AS (INSERT INTO pgque.jobs (id, queue, kind, args, priority, shard, state, ready_seq, \
                                                  run_at, max_attempts, actor, enqueued_at) \
                          SELECT id, 'jq', kind, args, 0, 0, \
                                 CASE WHEN sched THEN 'scheduled' ELSE 'ready' END, \
                                 CASE WHEN sched THEN NULL ELSE id END, \
                                 CASE WHEN sched THEN clock_timestamp() + interval '2 seconds' ELSE now() END, \
                                 25, actor, now() FROM n RETURNING id, state) \
             INSERT INTO pgque.job_events (job_id, queue, event, attempt) \
             SELECT id, 'jq', CASE WHEN state = 'ready' THEN 'enqueued' ELSE 'scheduled' END, 0 FROM ins",
            "UPDATE pgque.jobs SET state = 'running', attempt = attempt + 1, worker = 'w1', \
                    lease_token = nextval('pgque.job_lease_token_seq'), \
                    lease_until = clock_timestamp() + interval '1 hour', dispatched_at = now() \
              WHERE kind = 'r1'",
            "INSERT INTO pgque.job_events (job_id, queue, event, attempt, detail) \
             SELECT id, 'jq', 'dispatched', attempt, worker FROM pgque.jobs WHERE kind = 'r1'",
        ],
    );
    let row = c
        .query_one(
            "SELECT id, lease_token FROM pgque.jobs WHERE kind = 'r1'",
            &[],
        )
        .unwrap();
    (row.get(0), row.get(1))
}
