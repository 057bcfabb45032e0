//! In-server tests of rate limits (src/jobs/rate.rs): validation, the
//! bucket arithmetic and admission, for both stores and with capacity.
//! Concurrent dispatchers are tested in pg_test/tests/rate_limits.rs.
use pgrx::prelude::*;

#[pg_schema]
mod tests {
    use crate::jobs::tests::tests::{one, run, side_store, sqlstate};
    use pgrx::prelude::*;

    fn kinds(sql_args: &str) -> Vec<String> {
        Spi::connect(|c| {
            c.select(
                &format!("SELECT kind FROM pgque.dispatch({sql_args})"),
                None,
                &[],
            )
            .unwrap()
            .map(|r| r.get::<String>(1).unwrap().unwrap())
            .collect()
        })
    }

    fn enqueue_n(queue: &str, n: i32, extra: &str) {
        run(&format!(
            "SELECT count(*) FROM pgque.enqueue_ready_rows('{queue}',
                 (SELECT array_agg('k' || i ORDER BY i) FROM generate_series(1, {n}) i),
                 (SELECT array_agg('{{}}'::jsonb) FROM generate_series(1, {n}) i){extra})"
        ));
    }

    fn ks(r: std::ops::RangeInclusive<i32>) -> Vec<String> {
        r.map(|i| format!("k{i}")).collect()
    }

    /// Moves the queue bucket's last refill `secs` seconds into the past.
    fn age_queue_bucket(queue: &str, secs: i32) {
        run(&format!(
            "UPDATE pgque.job_rate_limits SET refilled_at = refilled_at - interval '{secs} seconds'
             WHERE queue_name = '{queue}'"
        ));
    }

    fn queue_tokens(queue: &str) -> f64 {
        one::<f64>(&format!(
            "SELECT tokens FROM pgque.job_rate_limits WHERE queue_name = '{queue}'"
        ))
        .unwrap()
    }

    #[pg_test]
    fn rate_limit_is_set_validated_and_removed() {
        run("SELECT pgque.create_job_queue('rv')");
        run("SELECT pgque.set_rate_limit('rv', 10, '1 minute')");
        assert_eq!(
            one::<String>(
                "SELECT jobs || '/' || per || '/' || burst || '/' || tokens
                 FROM pgque.job_rate_limits WHERE queue_name = 'rv'"
            ),
            Some("10/00:01:00/10/10".into())
        );
        run("SELECT pgque.set_rate_limit('rv', 10, '1 minute', 4)");
        // a changed bucket keeps its tokens, capped at the new burst
        assert_eq!(queue_tokens("rv"), 4.0);
        for (sql, st) in [
            ("SELECT pgque.set_rate_limit(NULL, 1, '1 s')", "22004"),
            ("SELECT pgque.set_rate_limit('', 1, '1 s')", "42602"),
            ("SELECT pgque.set_rate_limit('nope', 1, '1 s')", "42704"),
            ("SELECT pgque.set_rate_limit('rv', 0, '1 s')", "22003"),
            ("SELECT pgque.set_rate_limit('rv', 1, NULL)", "22004"),
            ("SELECT pgque.set_rate_limit('rv', 1, '0 s')", "22023"),
            ("SELECT pgque.set_rate_limit('rv', 1, '-1 s')", "22023"),
            ("SELECT pgque.set_rate_limit('rv', 1, '1 s', 0)", "22003"),
            ("SELECT pgque.set_actor_rate_limit(NULL, 1, '1 s')", "22004"),
            ("SELECT pgque.set_actor_rate_limit('', 1, '1 s')", "42602"),
            ("SELECT pgque.set_actor_rate_limit('a', -1, '1 s')", "22003"),
            ("SELECT pgque.set_actor_rate_limit('a', 1, NULL)", "22004"),
            (
                "SELECT pgque.set_actor_rate_limit('a', 1, '1 s', -2)",
                "22003",
            ),
        ] {
            assert_eq!(sqlstate(sql), st, "{sql}");
        }
        // refused calls changed nothing
        assert_eq!(queue_tokens("rv"), 4.0);
        assert_eq!(
            one::<i64>("SELECT count(*) FROM pgque.job_actors WHERE actor = 'a'"),
            Some(0)
        );
        run("SELECT pgque.set_rate_limit('rv', NULL, NULL)");
        assert_eq!(
            one::<i64>("SELECT count(*) FROM pgque.job_rate_limits"),
            Some(0)
        );
        run("SELECT pgque.set_actor_rate_limit('a', 3, '1 hour')");
        assert_eq!(
            one::<String>(
                "SELECT rate_jobs || '/' || rate_burst || '/' || tokens FROM pgque.job_actors
                 WHERE actor = 'a'"
            ),
            Some("3/3/3".into())
        );
        run("SELECT pgque.set_actor_rate_limit('a', NULL, NULL)");
        assert_eq!(
            one::<bool>("SELECT rate_jobs IS NULL AND tokens IS NULL FROM pgque.job_actors WHERE actor = 'a'"),
            Some(true)
        );
        // dropping the queue drops its bucket
        run("SELECT pgque.set_rate_limit('rv', 1, '1 s')");
        run("SELECT pgque.drop_job_queue('rv', true)");
        assert_eq!(
            one::<i64>("SELECT count(*) FROM pgque.job_rate_limits"),
            Some(0)
        );
    }

    /// Burst, then nothing, then exactly the refill, in order; for the job
    /// log (`log` true) or pgque.jobs.
    fn queue_bucket_admits_burst_then_refill(log: bool) {
        if !log {
            side_store();
        }
        run("SELECT pgque.create_job_queue('rq')");
        enqueue_n("rq", 8, "");
        // 6 per hour: one token every 600 s; burst 3
        run("SELECT pgque.set_rate_limit('rq', 6, '1 hour', 3)");
        assert_eq!(kinds("ARRAY['rq'], 10, 'w'"), ks(1..=3));
        assert!(queue_tokens("rq") < 0.01, "{}", queue_tokens("rq"));
        assert!(kinds("ARRAY['rq'], 10, 'w'").is_empty());
        // 1250 s: 2.08 tokens, 2 whole ones
        age_queue_bucket("rq", 1250);
        assert_eq!(kinds("ARRAY['rq'], 10, 'w'"), ks(4..=5));
        let left = queue_tokens("rq");
        assert!((0.08..0.1).contains(&left), "{left}");
        // a limit below the tokens takes only what it claims
        age_queue_bucket("rq", 3600);
        assert_eq!(kinds("ARRAY['rq'], 1, 'w'"), ks(6..=6));
        assert!((1.99..2.01).contains(&queue_tokens("rq")));
        // refill is capped at burst
        age_queue_bucket("rq", 36000);
        assert_eq!(kinds("ARRAY['rq'], 10, 'w'"), ks(7..=8));
        assert!((0.99..1.01).contains(&queue_tokens("rq")));
        // a queue of the same call without a limit is not debited, and the
        // call takes no more than the limited queue's tokens
        run("SELECT pgque.create_job_queue('rfree')");
        enqueue_n("rq", 3, "");
        enqueue_n("rfree", 3, "");
        assert_eq!(kinds("ARRAY['rq', 'rfree'], 10, 'w'").len(), 1);
        assert!(queue_tokens("rq") < 0.01);
        // removing the limit lets the rest go
        run("SELECT pgque.set_rate_limit('rq', NULL, NULL)");
        assert_eq!(kinds("ARRAY['rq', 'rfree'], 10, 'w'").len(), 5);
    }

    #[pg_test]
    fn queue_rate_limit_job_log() {
        queue_bucket_admits_burst_then_refill(true);
    }

    #[pg_test]
    fn queue_rate_limit_jobs_table() {
        queue_bucket_admits_burst_then_refill(false);
    }

    #[pg_test]
    fn actor_rate_limit_composes_with_capacity() {
        run("SELECT pgque.create_job_queue('ra')");
        run("SELECT pgque.set_actor_capacity('acme', 3)");
        run("SELECT pgque.set_actor_rate_limit('acme', 2, '1 hour')");
        enqueue_n(
            "ra",
            6,
            ", actors => (SELECT array_agg(CASE WHEN i % 2 = 1 THEN 'acme' ELSE 'other' END
                                           ORDER BY i) FROM generate_series(1, 6) i)",
        );
        // acme: k1, k3 (2 tokens); other (no limit): k2, k4, k6; held back:
        // k5, which stays first in line
        assert_eq!(
            kinds("ARRAY['ra'], 10, 'w'"),
            vec!["k1", "k2", "k3", "k4", "k6"]
        );
        assert!(kinds("ARRAY['ra'], 10, 'w'").is_empty());
        // a full hour: 2 tokens, but capacity leaves 1: one admitted, one
        // token left
        run(
            "UPDATE pgque.job_actors SET refilled_at = refilled_at - interval '1 hour'
             WHERE actor = 'acme'",
        );
        enqueue_n("ra", 1, ", actors => ARRAY['acme']");
        assert_eq!(kinds("ARRAY['ra'], 10, 'w'"), vec!["k5"]);
        let (running, tokens) = Spi::get_two::<i32, f64>(
            "SELECT running, tokens FROM pgque.job_actors WHERE actor = 'acme'",
        )
        .unwrap();
        assert_eq!(running, Some(3));
        assert!((0.99..1.01).contains(&tokens.unwrap()), "{tokens:?}");
    }

    #[pg_test]
    fn queue_rate_limit_and_capacity_debit_only_what_started() {
        side_store();
        run("SELECT pgque.create_job_queue('rc')");
        run("SELECT pgque.set_actor_capacity('acme', 2)");
        run("SELECT pgque.set_rate_limit('rc', 4, '1 hour')");
        enqueue_n(
            "rc",
            5,
            ", actors => (SELECT array_agg('acme'::text) FROM generate_series(1, 5))",
        );
        assert_eq!(kinds("ARRAY['rc'], 10, 'w'"), ks(1..=2));
        assert!((1.99..2.01).contains(&queue_tokens("rc")));
    }

    // ---- plan shape: the bucket statements of a queue with a rate limit ----

    /// The largest rows x loops (with the rows its filters removed) of any
    /// node of `EXECUTE <q>`, and the rows it returned.
    fn widest(q: &str) -> (f64, f64) {
        crate::jobs::tests::tests::explain_widest(&format!("EXECUTE {q}"))
    }

    /// The largest rows (with those its filters removed) x loops of any
    /// node over pgque.job_rate_limits in the last plan `widest` measured.
    fn widest_on_buckets() -> f64 {
        one::<f64>(
            "SELECT coalesce(max(((n->>'Actual Rows')::float8
                         + coalesce((n->>'Rows Removed by Filter')::float8, 0)
                         + coalesce((n->>'Rows Removed by Index Recheck')::float8, 0))
                        * (n->>'Actual Loops')::float8), 0)
             FROM plans, jsonb_path_query(p, 'strict $.**') n
             WHERE jsonb_typeof(n) = 'object' AND n->>'Relation Name' = 'job_rate_limits'",
        )
        .unwrap()
    }

    /// The last plan `widest` measured, as JSON (for a failure's message).
    fn plan() -> String {
        one::<String>("SELECT p::text FROM plans").unwrap_or_default()
    }

    /// Dispatch's two statements that read the queue buckets, LOCK_LANES_SQL
    /// and DEBIT_SQL, probe the call's buckets by key: with 1,000 other
    /// queues' buckets no node handles more than a few rows, under the kept
    /// generic plan dispatch makes (stmt::PLAN_SETTINGS) while the bucket
    /// table holds one row, and under fresh custom and generic plans with
    /// the planner's default settings, before and after ANALYZE. A scan of
    /// the bucket table reads (or filters out) all 1,001 rows and fails the
    /// bound.
    #[pg_test]
    fn plan_of_bucket_statements_is_a_key_probe_among_1000_buckets() {
        use crate::jobs::log::dispatch::LOCK_LANES_SQL;
        use crate::jobs::rate::DEBIT_SQL;
        // one lane row, one bucket row, a few per-node overheads
        let bound = 4.0;
        run("SELECT pgque.create_job_queue('deep')");
        enqueue_n("deep", 200, "");
        run("SELECT pgque.set_rate_limit('deep', 1000000, '1 second')");
        // the kept plans of a backend that dispatched while 'deep' had the
        // only bucket
        for (name, value) in crate::jobs::log::stmt::PLAN_SETTINGS {
            run(&format!(
                "SET LOCAL {} = {}",
                name.to_str().unwrap(),
                value.to_str().unwrap()
            ));
        }
        run("DEALLOCATE ALL");
        run(&format!("PREPARE l(text[]) AS {LOCK_LANES_SQL}"));
        run(&format!("PREPARE b(text[], int[]) AS {DEBIT_SQL}"));
        let tid = || {
            one::<String>("SELECT ctid::text FROM pgque.job_rate_limits WHERE queue_name = 'deep'")
                .unwrap()
        };
        widest("l(ARRAY['deep'])");
        widest(&format!("b(ARRAY['{}'], ARRAY[1])", tid()));
        let mut debits = 1.0;
        run("SELECT pgque.create_job_queue('other' || i),
                    pgque.set_rate_limit('other' || i, 5, '1 second')
             FROM generate_series(1, 1000) i");
        assert_eq!(
            one::<i64>("SELECT count(*) FROM pgque.job_rate_limits"),
            Some(1001)
        );
        // every node under the settings dispatch runs with; with the
        // default settings (below), the bucket table's nodes (a custom plan
        // with the default settings may scan job_lanes, which dispatch never
        // runs)
        let mut check = |what: &str, all_nodes: bool| {
            let (w, returned) = widest("l(ARRAY['deep'])");
            let w = if all_nodes { w } else { widest_on_buckets() };
            assert_eq!(returned, 1.0, "lock, {what}");
            assert!(
                w <= bound,
                "lock, {what}: a node processed {w} rows (bound {bound}): {}",
                plan()
            );
            let (w, _) = widest(&format!("b(ARRAY['{}'], ARRAY[1])", tid()));
            let w = if all_nodes { w } else { widest_on_buckets() };
            assert!(
                w <= bound,
                "debit, {what}: a node processed {w} rows (bound {bound}): {}",
                plan()
            );
            debits += 1.0;
            // (one statement: no refill between the calls) the debit took
            // one token from 'deep' and none from any other bucket
            assert_eq!(queue_tokens("deep"), 1_000_000.0 - debits, "{what}");
            assert_eq!(
                one::<i64>("SELECT count(*) FROM pgque.job_rate_limits WHERE tokens <> 5"),
                Some(1),
                "{what}"
            );
        };
        check("kept generic plan made on one bucket", true);
        run("SET LOCAL enable_seqscan = on");
        run("SET LOCAL enable_bitmapscan = on");
        for analyzed in [false, true] {
            if analyzed {
                run("ANALYZE pgque.job_rate_limits, pgque.job_lanes");
            }
            for generic in [false, true] {
                let mode = if generic {
                    "force_generic_plan"
                } else {
                    "force_custom_plan"
                };
                run(&format!("SET LOCAL plan_cache_mode = {mode}"));
                run("DEALLOCATE ALL");
                run(&format!("PREPARE l(text[]) AS {LOCK_LANES_SQL}"));
                run(&format!("PREPARE b(text[], int[]) AS {DEBIT_SQL}"));
                check(&format!("generic={generic} analyzed={analyzed}"), false);
            }
        }
        // and dispatch itself: the whole limit from 'deep'; with 'other1' in
        // the call, no more than the emptiest bucket's 5 tokens
        assert_eq!(kinds("ARRAY['deep'], 50, 'w'").len(), 50);
        assert_eq!(kinds("ARRAY['deep', 'other1'], 50, 'w'").len(), 5);
    }

    /// The setters are pgque_admin's; the view is readable by pgque_reader
    /// and shows the tokens refilled up to now.
    #[pg_test]
    fn rate_limit_roles_and_view() {
        run("SELECT pgque.create_job_queue('rr')");
        assert_eq!(sqlstate("SELECT 1"), "ok"); // creates the helper as superuser
        for role in ["pgque_writer", "pgque_reader"] {
            run(&format!("SET LOCAL ROLE {role}"));
            assert_eq!(
                sqlstate("SELECT pgque.set_rate_limit('rr', 1, '1 s')"),
                "42501",
                "{role}"
            );
            assert_eq!(
                sqlstate("SELECT pgque.set_actor_rate_limit('a', 1, '1 s')"),
                "42501",
                "{role}"
            );
            assert_eq!(
                sqlstate("SELECT count(*) FROM pgque.job_rate_limits"),
                "42501",
                "{role}"
            );
            run("RESET ROLE");
        }
        run("SET LOCAL ROLE pgque_writer");
        assert_eq!(sqlstate("SELECT count(*) FROM pgque.rate_limits"), "42501");
        run("RESET ROLE");
        run("SET LOCAL ROLE pgque_admin");
        assert_eq!(
            sqlstate("SELECT pgque.set_rate_limit('rr', 6, '1 hour', 3)"),
            "ok"
        );
        assert_eq!(
            sqlstate("SELECT pgque.set_actor_rate_limit('acme', 2, '1 minute')"),
            "ok"
        );
        run("RESET ROLE");
        age_queue_bucket("rr", 1200);
        run("SET LOCAL ROLE pgque_reader");
        assert_eq!(
            one::<String>(
                "SELECT string_agg(concat_ws('/', scope, name, jobs, per, burst, round(tokens::numeric, 2)),
                                   ' ' ORDER BY scope)
                 FROM pgque.rate_limits"
            ),
            // 'rr' started full (3) and refills at most to its burst
            Some("actor/acme/2/00:01:00/2/2.00 queue/rr/6/01:00:00/3/3.00".into())
        );
        run("RESET ROLE");
        enqueue_n("rr", 5, "");
        assert_eq!(kinds("ARRAY['rr'], 10, 'w'").len(), 3);
        assert_eq!(
            one::<f64>("SELECT round(tokens::numeric, 2)::float8 FROM pgque.rate_limits WHERE scope = 'queue'"),
            Some(0.0)
        );
    }
}
