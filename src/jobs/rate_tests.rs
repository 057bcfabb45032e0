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
}
