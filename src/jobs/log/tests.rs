//! In-server tests of the job log (each in a transaction that is rolled
//! back: one session, so no concurrency here; pg_test/tests/jobs_log.rs has
//! the multi-session ones).
use pgrx::prelude::*;

#[pg_schema]
mod tests {
    use crate::jobs::tests::tests::{count, explain_widest, one, prepare_d, run, sqlstate};
    use pgrx::prelude::*;

    /// (job_id, kind, lease_token, attempt) in dispatch order.
    fn dispatch(args: &str) -> Vec<(i64, String, i64, i32)> {
        Spi::connect(|c| {
            c.select(
                &format!("SELECT job_id, kind, lease_token, attempt FROM pgque.dispatch({args})"),
                None,
                &[],
            )
            .unwrap()
            .map(|r| {
                (
                    r.get::<i64>(1).unwrap().unwrap(),
                    r.get::<String>(2).unwrap().unwrap(),
                    r.get::<i64>(3).unwrap().unwrap(),
                    r.get::<i32>(4).unwrap().unwrap(),
                )
            })
            .collect()
        })
    }

    fn kinds(rows: &[(i64, String, i64, i32)]) -> Vec<String> {
        rows.iter().map(|r| r.1.clone()).collect()
    }

    /// Enqueues kinds `<prefix>1..<prefix>n` into `queue` in one call.
    fn enqueue(queue: &str, prefix: &str, n: i32, extra: &str) -> Vec<i64> {
        Spi::connect(|c| {
            c.select(
                &format!(
                    "SELECT job_id FROM pgque.enqueue_ready_rows('{queue}',
                         (SELECT array_agg('{prefix}' || i ORDER BY i) FROM generate_series(1, {n}) i),
                         (SELECT array_agg(jsonb_build_object('i', i) ORDER BY i) FROM generate_series(1, {n}) i){extra})
                     ORDER BY ord"
                ),
                None,
                &[],
            )
            .unwrap()
            .map(|r| r.get::<i64>(1).unwrap().unwrap())
            .collect()
        })
    }

    fn complete_many(rows: &[(i64, String, i64, i32)]) -> i32 {
        let ids: Vec<String> = rows.iter().map(|r| r.0.to_string()).collect();
        let toks: Vec<String> = rows.iter().map(|r| r.2.to_string()).collect();
        one::<i32>(&format!(
            "SELECT pgque.complete_many(ARRAY[{}]::bigint[], ARRAY[{}]::bigint[])",
            ids.join(","),
            toks.join(",")
        ))
        .unwrap()
    }

    fn state(id: i64) -> String {
        one::<String>(&format!(
            "SELECT state || '/' || attempt || '/' || stored_in FROM pgque.all_jobs WHERE id = {id}"
        ))
        .unwrap_or_else(|| "none".into())
    }

    /// lock_tokens takes exactly the locks LOCK_CLAIMS_SQL takes for the same
    /// claims (class, hashint8(token)): a completion and a rescue must wait
    /// on one lock, whichever way each computed it. Tokens of both signs and
    /// with both halves set, so that the hash's sign and wrap are covered.
    #[pg_test]
    fn lock_tokens_takes_the_claim_locks_lock_claims_takes() {
        let tokens: [i64; 5] = [1, 42, -7, 0x7FFF_FFFF_0000_0001, i64::MIN + 3];
        crate::jobs::log::lock_tokens(&tokens);
        for t in tokens {
            let held = count(&format!(
                "SELECT count(*) FROM pg_catalog.pg_locks \
                  WHERE locktype = 'advisory' AND pid = pg_catalog.pg_backend_pid() AND granted \
                    AND database = (SELECT oid FROM pg_catalog.pg_database WHERE datname = current_database()) \
                    AND objsubid = 25187 \
                    AND classid = (((pg_catalog.hashint8({t}::bigint)::bigint >> 32) & 4294967295)::text)::oid \
                    AND objid = ((pg_catalog.hashint8({t}::bigint)::bigint & 4294967295)::text)::oid"
            ));
            assert_eq!(held, 1, "the claim lock of token {t}");
        }
        // taking them again through SQL adds no new lock: they are the same
        let before = count("SELECT count(*) FROM pg_catalog.pg_locks WHERE locktype = 'advisory' AND pid = pg_catalog.pg_backend_pid()");
        run(&format!(
            "SELECT count(pgque.xact_lock(1785684579, pg_catalog.hashint8(t))) \
               FROM unnest(ARRAY{tokens:?}::bigint[]) t"
        ));
        let after = count("SELECT count(*) FROM pg_catalog.pg_locks WHERE locktype = 'advisory' AND pid = pg_catalog.pg_backend_pid()");
        assert_eq!(before, 5);
        assert_eq!(after, before);
    }

    #[pg_test]
    fn a_batch_is_one_row_a_dispatch_one_claim_a_completion_one_done_row() {
        run("SELECT pgque.create_job_queue('lg')");
        let ids = enqueue("lg", "k", 100, "");
        assert_eq!(ids.len(), 100);
        // increasing in input order; not contiguous: tests running alongside
        // draw from the same sequence
        assert!(ids.windows(2).all(|w| w[1] > w[0]), "ids in input order");
        assert_eq!(count("SELECT count(*) FROM pgque.job_log"), 1);
        assert_eq!(count("SELECT count(*) FROM pgque.jobs"), 0);
        assert_eq!(
            count("SELECT count(*) FROM pgque.all_jobs WHERE state = 'ready'"),
            100
        );

        let first = dispatch("ARRAY['lg'], 40, 'w1'");
        assert_eq!(first.len(), 40);
        assert_eq!(first.iter().map(|r| r.0).collect::<Vec<_>>(), ids[..40]);
        assert!(
            first.iter().all(|r| r.2 == first[0].2 && r.3 == 1),
            "one token, attempt 1"
        );
        let rest = dispatch("ARRAY['lg'], 100, 'w1'");
        assert_eq!(rest.len(), 60);
        assert_eq!(rest[0].0, ids[40]);
        assert!(dispatch("ARRAY['lg'], 100, 'w1'").is_empty());
        assert_eq!(count("SELECT count(*) FROM pgque.job_claims"), 2);
        assert_eq!(
            count("SELECT count(*) FROM pgque.all_jobs WHERE state = 'running' AND worker = 'w1'"),
            100
        );

        assert_eq!(complete_many(&first), 40);
        assert_eq!(complete_many(&first), 0, "a second completion is refused");
        assert_eq!(complete_many(&rest), 60);
        assert_eq!(count("SELECT count(*) FROM pgque.job_done"), 2);
        assert_eq!(
            count("SELECT count(*) FROM pgque.all_jobs WHERE state = 'completed'"),
            100
        );
        assert_eq!(
            count("SELECT count(*) FROM pgque.jobs"),
            0,
            "nothing per job"
        );
        assert_eq!(
            count("SELECT count(*) FROM pgque.job_history WHERE job_id = ANY (ARRAY(SELECT id FROM pgque.all_jobs))"),
            300,
            "enqueued, dispatched, completed for each job"
        );
        assert_eq!(
            one::<String>("SELECT completed || '/' || ready || '/' || running FROM pgque.job_queue_status WHERE queue_name = 'lg'"),
            Some("100/0/0".into())
        );
    }

    #[pg_test]
    fn big_and_mixed_priority_batches_split_into_rows_of_one_lane() {
        run("SELECT pgque.create_job_queue('sp')");
        let ids = enqueue("sp", "k", 600, ", priorities => (SELECT array_agg((i % 2)::smallint ORDER BY i) FROM generate_series(1, 600) i)");
        assert_eq!(ids.len(), 600);
        assert_eq!(
            count("SELECT count(*) FROM pgque.job_lanes WHERE queue = 'sp'"),
            2
        );
        assert!(count("SELECT max(n) FROM pgque.job_log") <= 256);
        assert_eq!(count("SELECT sum(n) FROM pgque.job_log"), 600);
        // priority 0 (even i) first, in input order, then priority 1
        let got = dispatch("ARRAY['sp'], 400, 'w'");
        let want: Vec<String> = (1..=600)
            .filter(|i| i % 2 == 0)
            .chain((1..=600).filter(|i| i % 2 == 1))
            .take(400)
            .map(|i| format!("k{i}"))
            .collect();
        assert_eq!(kinds(&got), want);
        // each job's args came along
        assert_eq!(
            count("SELECT count(*) FROM pgque.all_jobs WHERE kind = 'k' || (args->>'i')"),
            600
        );
    }

    #[pg_test]
    fn stale_and_foreign_tokens_are_refused() {
        run("SELECT pgque.create_job_queue('st')");
        enqueue("st", "k", 4, "");
        let a = dispatch("ARRAY['st'], 2, 'w'");
        let b = dispatch("ARRAY['st'], 2, 'w'");
        assert_ne!(a[0].2, b[0].2);
        // a job with the other claim's token
        assert_eq!(
            one::<bool>(&format!("SELECT pgque.complete({}, {})", a[0].0, b[0].2)),
            Some(false)
        );
        assert_eq!(
            one::<bool>(&format!("SELECT pgque.complete({}, {})", a[0].0, a[0].2)),
            Some(true)
        );
        assert_eq!(
            one::<bool>(&format!("SELECT pgque.complete({}, {})", a[0].0, a[0].2)),
            Some(false)
        );
        assert_eq!(
            one::<bool>(&format!("SELECT pgque.complete({}, 987654321)", a[1].0)),
            Some(false)
        );
        // fail and snooze with a stale token change nothing
        assert_eq!(
            one::<String>(&format!("SELECT pgque.fail({}, {}, 'x')", a[0].0, a[0].2)),
            None
        );
        assert_eq!(state(a[0].0), "completed/1/log");
    }

    #[pg_test]
    fn fail_moves_the_job_out_of_its_claim_and_retries_it_first() {
        run("SELECT pgque.create_job_queue('fl')");
        enqueue("fl", "k", 5, "");
        let got = dispatch("ARRAY['fl'], 3, 'w'");
        let (id, tok) = (got[1].0, got[1].2);
        assert_eq!(
            one::<String>(&format!("SELECT pgque.fail({id}, {tok}, 'boom', now())")),
            Some("ready".into())
        );
        assert_eq!(state(id), "ready/1/jobs");
        assert_eq!(
            one::<String>(&format!(
                "SELECT errors->0->>'error' FROM pgque.jobs WHERE id = {id}"
            )),
            Some("boom".into())
        );
        // its batch siblings still complete with the claim's token; it does not
        assert_eq!(complete_many(&got), 2);
        // the retried job keeps its place: before k4 and k5
        let next = dispatch("ARRAY['fl'], 10, 'w'");
        assert_eq!(kinds(&next), vec!["k2", "k4", "k5"]);
        assert_eq!(next[0].3, 2, "second attempt");
        assert_eq!(complete_many(&next), 3);
        // backoff without retry_at, then the terminal failure
        enqueue("fl", "m", 1, ", max_attempts => ARRAY[2]");
        let m = dispatch("ARRAY['fl'], 1, 'w'");
        let st =
            one::<String>(&format!("SELECT pgque.fail({}, {}, 'e1')", m[0].0, m[0].2)).unwrap();
        assert_eq!(st, "scheduled");
        run(&format!(
            "UPDATE pgque.jobs SET run_at = now() WHERE id = {}",
            m[0].0
        ));
        run("SELECT pgque.promote_scheduled_jobs()");
        let m2 = dispatch("ARRAY['fl'], 1, 'w'");
        assert_eq!(m2[0].0, m[0].0);
        assert_eq!(
            one::<String>(&format!(
                "SELECT pgque.fail({}, {}, 'e2')",
                m2[0].0, m2[0].2
            )),
            Some("failed".into())
        );
    }

    #[pg_test]
    fn snooze_and_heartbeat_act_on_log_jobs() {
        run("SELECT pgque.create_job_queue('sn')");
        enqueue("sn", "k", 3, "");
        let got = dispatch("ARRAY['sn'], 3, 'w', interval '1 minute'");
        let hb = count(&format!(
            "SELECT count(*) FROM pgque.heartbeat(ARRAY[{}, {}], ARRAY[{}, -1], interval '1 hour')
             WHERE lease_until > now() + interval '50 minutes'",
            got[0].0, got[1].0, got[0].2
        ));
        assert_eq!(hb, 1, "only the pair with the claim's token");
        assert_eq!(
            count("SELECT count(*) FROM pgque.job_claims WHERE lease_until > now() + interval '50 minutes'"),
            1
        );
        assert_eq!(
            one::<bool>(&format!(
                "SELECT pgque.snooze({}, {}, now() + interval '1 hour')",
                got[2].0, got[2].2
            )),
            Some(true)
        );
        assert_eq!(state(got[2].0), "scheduled/0/jobs");
        // a job that left its claim (a done row of kind o) is not extended
        // with it; the claim's other jobs still are
        assert_eq!(
            one::<String>(&format!(
                "SELECT string_agg(job_id::text, ',' ORDER BY job_id)
                 FROM pgque.heartbeat(ARRAY[{}, {}], ARRAY[{}, {}], interval '1 hour')",
                got[2].0, got[1].0, got[2].2, got[1].2
            )),
            Some(got[1].0.to_string())
        );
        assert_eq!(complete_many(&got), 2);
    }

    #[pg_test]
    fn cancel_of_ready_running_and_completed_log_jobs() {
        run("SELECT pgque.create_job_queue('cx')");
        let ids = enqueue("cx", "k", 6, "");
        let got = dispatch("ARRAY['cx'], 2, 'w'");
        // a ready job deep in the lane: a hole the dispatch passes over
        assert_eq!(
            one::<bool>(&format!("SELECT pgque.cancel({})", ids[3])),
            Some(true)
        );
        assert_eq!(state(ids[3]), "cancelled/0/jobs");
        // a running job: its complete is refused, its sibling completes
        assert_eq!(
            one::<bool>(&format!("SELECT pgque.cancel({})", got[0].0)),
            Some(true)
        );
        assert_eq!(complete_many(&got), 1);
        // a completed one is not cancelled
        assert_eq!(
            one::<bool>(&format!("SELECT pgque.cancel({})", got[1].0)),
            Some(false)
        );
        assert_eq!(sqlstate("SELECT pgque.cancel(987654321)"), "42704");
        let next = dispatch("ARRAY['cx'], 10, 'w'");
        assert_eq!(kinds(&next), vec!["k3", "k5", "k6"]);
        assert_eq!(complete_many(&next), 3);
        // retry_job puts the cancelled ready job back in its place
        assert_eq!(
            one::<bool>(&format!("SELECT pgque.retry_job({})", ids[3])),
            Some(true)
        );
        enqueue("cx", "z", 1, "");
        let again = dispatch("ARRAY['cx'], 10, 'w'");
        assert_eq!(kinds(&again), vec!["k4", "z1"]);
    }

    #[pg_test]
    fn an_expired_claim_is_rescued_and_a_finished_one_settled() {
        run("SELECT pgque.create_job_queue('rs')");
        enqueue("rs", "k", 10, "");
        let got = dispatch("ARRAY['rs'], 10, 'w'");
        assert_eq!(complete_many(&got[..3]), 3);
        run("UPDATE pgque.job_claims SET lease_until = now() - interval '1 second'");
        assert_eq!(one::<i32>("SELECT pgque.rescue_expired_leases()"), Some(7));
        assert_eq!(
            count("SELECT count(*) FROM pgque.jobs WHERE state = 'ready' AND attempt = 1"),
            7
        );
        assert_eq!(
            count("SELECT count(*) FROM pgque.job_claims WHERE state = 'r'"),
            1
        );
        // the old token is stale now
        assert_eq!(complete_many(&got[3..]), 0);
        let again = dispatch("ARRAY['rs'], 10, 'w'");
        assert_eq!(
            kinds(&again),
            (4..=10).map(|i| format!("k{i}")).collect::<Vec<_>>()
        );
        assert!(again.iter().all(|r| r.3 == 2));
        assert_eq!(complete_many(&again), 7);
        // a claim whose jobs all finished is settled, nothing moves
        enqueue("rs", "m", 2, "");
        let m = dispatch("ARRAY['rs'], 2, 'w'");
        assert_eq!(complete_many(&m), 2);
        run("UPDATE pgque.job_claims SET lease_until = now() - interval '1 second' WHERE state = 'a'");
        assert_eq!(one::<i32>("SELECT pgque.rescue_expired_leases()"), Some(0));
        assert_eq!(
            count("SELECT count(*) FROM pgque.job_claims WHERE state = 'd'"),
            1
        );
    }

    /// job_queue_status counts the log by its rows, and get_job reads one job
    /// by key; both must agree with all_jobs, which unpacks every job
    /// (0.4.0's status definition is kept here as the reference), in every
    /// state a log job can reach: ready, hole (cancelled while ready),
    /// spilled, running, partly and wholly completed, failed out of its
    /// claim, snoozed, rescued, several lanes.
    #[pg_test]
    fn job_queue_status_and_get_job_agree_with_all_jobs() {
        const REFERENCE: &str = "SELECT q.queue_name, q.mode, q.paused,
                count(j.id) FILTER (WHERE j.state = 'scheduled'),
                count(j.id) FILTER (WHERE j.state = 'ready'),
                count(j.id) FILTER (WHERE j.state = 'running'),
                count(j.id) FILTER (WHERE j.state = 'completed'),
                count(j.id) FILTER (WHERE j.state = 'failed'),
                count(j.id) FILTER (WHERE j.state = 'cancelled'),
                now() - min(j.run_at) FILTER (WHERE j.state = 'ready'),
                count(DISTINCT (j.priority, j.shard)) FILTER (WHERE j.state IN ('waiting', 'scheduled', 'ready', 'running')),
                count(j.id) FILTER (WHERE j.state = 'waiting')
            FROM pgque.job_queues q LEFT JOIN pgque.all_jobs j ON j.queue = q.queue_name
            GROUP BY q.queue_name, q.mode, q.paused";
        let same = || {
            let diff = count(&format!(
                "SELECT count(*) FROM (({REFERENCE} EXCEPT SELECT * FROM pgque.job_queue_status)
                  UNION ALL (SELECT * FROM pgque.job_queue_status EXCEPT {REFERENCE})) d"
            ));
            let shown = one::<String>(
                "SELECT string_agg(concat_ws(',', queue_name, scheduled, ready, running, completed, failed,
                                            cancelled, lanes), ' ' ORDER BY queue_name)
                   FROM pgque.job_queue_status",
            );
            assert_eq!(diff, 0, "job_queue_status differs from all_jobs: {shown:?}");
            // every job, and ids of no job (before, between and after)
            let wrong = one::<String>(
                "SELECT string_agg(i::text, ',') FROM (
                     SELECT i FROM generate_series(
                         (SELECT min(id) - 2 FROM pgque.all_jobs), (SELECT max(id) + 2 FROM pgque.all_jobs)) i
                     WHERE (SELECT count(*) FROM (
                               (SELECT * FROM pgque.all_jobs a WHERE a.id = i
                                EXCEPT ALL SELECT * FROM pgque.get_job(i))
                               UNION ALL
                               (SELECT * FROM pgque.get_job(i)
                                EXCEPT ALL SELECT * FROM pgque.all_jobs a WHERE a.id = i)) d) > 0) x",
            );
            assert_eq!(wrong, None, "get_job differs from all_jobs for these ids");
            shown.unwrap_or_default()
        };
        run("SELECT pgque.create_job_queue('s1')");
        run("SELECT pgque.create_job_queue('s2')");
        run("SELECT pgque.create_job_queue('s3')");
        same();
        // s1: 12 log jobs with explicit past run_ats in one row, a side job
        // with an actor after them, one scheduled
        enqueue("s1", "a", 12, ", run_at => (SELECT array_agg(now() - i * interval '1 minute') FROM generate_series(1, 12) i)");
        enqueue("s1", "x", 1, ", actors => ARRAY['act']");
        enqueue("s1", "t", 1, ", run_at => ARRAY[now() + interval '1 day']");
        same();
        // a ready log job cancelled: a hole in its lane (the sixth by id, not
        // min + 5: tests running alongside draw from the same sequence)
        let s1 = one::<i64>(
            "SELECT id FROM pgque.all_jobs WHERE queue = 's1' AND stored_in = 'log'
              ORDER BY id OFFSET 5 LIMIT 1",
        )
        .unwrap();
        run(&format!("SELECT pgque.cancel({s1})"));
        same();
        // dispatching s1 merges the stores (the actor job is ready): a spill
        let got = dispatch("ARRAY['s1'], 3, 'w'");
        assert_eq!(got.len(), 3);
        same();
        // s2: three lanes, 9 jobs; dispatch 5, complete 2 of them, fail one
        // (out of its claim), snooze one
        enqueue(
            "s2",
            "p",
            9,
            ", priorities => ARRAY[0,0,0,1,1,1,2,2,2]::smallint[]",
        );
        let got = dispatch("ARRAY['s2'], 5, 'w'");
        assert_eq!(got.len(), 5);
        assert_eq!(complete_many(&got[..2]), 2);
        run(&format!(
            "SELECT pgque.fail({}, {}, 'boom')",
            got[2].0, got[2].2
        ));
        run(&format!(
            "SELECT pgque.snooze({}, {}, now() + interval '1 hour')",
            got[3].0, got[3].2
        ));
        let shown = same();
        assert!(shown.contains("s2,2,4,1,2,0,0,3"), "{shown}");
        // s3: a claim wholly completed, and one rescued after its lease
        enqueue("s3", "r", 6, "");
        let got = dispatch("ARRAY['s3'], 2, 'w'");
        assert_eq!(complete_many(&got), 2);
        let got = dispatch("ARRAY['s3'], 3, 'w'");
        assert_eq!(complete_many(&got[..1]), 1);
        same();
        run("UPDATE pgque.job_claims SET lease_until = now() - interval '1 second' WHERE state = 'a'");
        assert!(one::<i32>("SELECT pgque.rescue_expired_leases()").unwrap() > 0);
        let shown = same();
        assert!(shown.contains("s3,0,3,0,3,0,0,1"), "{shown}");
        // the rest of every queue through, both stores
        for _ in 0..10 {
            let got = dispatch("ARRAY['s1', 's2', 's3'], 50, 'w'");
            if got.is_empty() {
                break;
            }
            complete_many(&got);
        }
        same();
    }

    /// Dropping a queue with running log jobs settles their claims (their
    /// tokens are stale), and a claim whose lane is gone some other way is
    /// settled by the rescue instead of being found again on every run.
    #[pg_test]
    fn a_dropped_queue_leaves_no_active_claim_behind() {
        run("SELECT pgque.create_job_queue('dq')");
        enqueue("dq", "k", 10, "");
        // not forced: refused while jobs are ready or running
        assert_eq!(sqlstate("SELECT pgque.drop_job_queue('dq')"), "55000");
        let got = dispatch("ARRAY['dq'], 4, 'w'");
        assert_eq!(got.len(), 4);
        assert_eq!(
            one::<bool>("SELECT pgque.drop_job_queue('dq', true)"),
            Some(true)
        );
        assert_eq!(
            count("SELECT count(*) FROM pgque.job_claims WHERE state = 'a'"),
            0
        );
        assert_eq!(complete_many(&got), 0, "a dropped queue's tokens are stale");
        // a claim left active without its lane (as a dispatch racing the
        // drop leaves it): the rescue settles it and moves nothing
        run("SELECT pgque.create_job_queue('dq2')");
        enqueue("dq2", "k", 3, "");
        let got = dispatch("ARRAY['dq2'], 3, 'w'");
        assert_eq!(got.len(), 3);
        run("DELETE FROM pgque.job_lanes WHERE queue = 'dq2'");
        run("UPDATE pgque.job_claims SET lease_until = now() - interval '1 second' WHERE state = 'a'");
        assert_eq!(one::<i32>("SELECT pgque.rescue_expired_leases()"), Some(0));
        assert_eq!(
            count("SELECT count(*) FROM pgque.job_claims WHERE state = 'a'"),
            0
        );
        assert_eq!(count("SELECT count(*) FROM pgque.jobs"), 0);
    }

    #[pg_test]
    fn jobs_of_both_stores_are_dispatched_in_one_fifo_order() {
        run("SELECT pgque.create_job_queue('mx')");
        enqueue("mx", "a", 3, "");
        // an actor keeps these in pgque.jobs
        enqueue("mx", "b", 2, ", actors => ARRAY['x', 'x']");
        enqueue("mx", "c", 3, "");
        assert_eq!(count("SELECT count(*) FROM pgque.jobs"), 2);
        let mut order = Vec::new();
        loop {
            let got = dispatch("ARRAY['mx'], 2, 'w'");
            if got.is_empty() {
                break;
            }
            order.extend(kinds(&got));
        }
        assert_eq!(order, vec!["a1", "a2", "a3", "b1", "b2", "c1", "c2", "c3"]);
        // every spilled job went through pgque.jobs once, none twice
        assert_eq!(
            count("SELECT count(*) FROM pgque.all_jobs WHERE state = 'running'"),
            8
        );
    }

    #[pg_test]
    fn paused_queues_and_the_setting_off_keep_jobs_out_of_the_log() {
        run("SELECT pgque.create_job_queue('pz')");
        enqueue("pz", "k", 2, "");
        run("SELECT pgque.pause_job_queue('pz')");
        assert!(dispatch("ARRAY['pz'], 10, 'w'").is_empty());
        run("SELECT pgque.resume_job_queue('pz')");
        assert_eq!(dispatch("ARRAY['pz'], 10, 'w'").len(), 2);
        run("SET LOCAL pgque.job_log = off");
        enqueue("pz", "o", 2, "");
        assert_eq!(
            count("SELECT count(*) FROM pgque.jobs WHERE queue = 'pz'"),
            2
        );
        // round robin and scheduled jobs never enter the log
        run("SET LOCAL pgque.job_log = on");
        run("SELECT pgque.create_job_queue('rr', 'round_robin')");
        enqueue("rr", "k", 2, "");
        enqueue("pz", "s", 1, ", run_at => ARRAY[now() + interval '1 hour']");
        assert_eq!(count("SELECT count(*) FROM pgque.job_log"), 1);
    }

    #[pg_test]
    fn a_round_robin_switch_spills_the_log_into_the_fair_walk() {
        run("SELECT pgque.create_job_queue('sw')");
        enqueue(
            "sw",
            "big",
            20,
            ", fairness_keys => (SELECT array_agg('big'::text) FROM generate_series(1, 20))",
        );
        enqueue("sw", "small", 2, ", fairness_keys => ARRAY['s1', 's2']");
        run("SELECT pgque.set_job_queue_config('sw', 'mode', 'round_robin')");
        let got = dispatch("ARRAY['sw'], 4, 'w'");
        assert_eq!(got.len(), 4);
        assert!(
            kinds(&got).iter().any(|k| k.starts_with("small")),
            "{:?}",
            kinds(&got)
        );
    }

    #[pg_test]
    fn a_dispatch_reads_as_many_log_rows_as_its_limit_needs() {
        run("SELECT pgque.create_job_queue('many')");
        // 70 single-job rows, then one row of 5: a dispatch of 66 reads the
        // first two rows with the lane state, then more in further reads
        for i in 1..=70 {
            enqueue("many", &format!("s{i}_"), 1, "");
        }
        enqueue("many", "b", 5, "");
        let first = dispatch("ARRAY['many'], 66, 'w'");
        let want: Vec<String> = (1..=66).map(|i| format!("s{i}_1")).collect();
        assert_eq!(kinds(&first), want);
        assert!(first
            .windows(2)
            .all(|w| w[0].0 < w[1].0 && w[0].2 == w[1].2));
        // the cursor is now between single rows; the next call takes the
        // last four single jobs and the first two of the batch row
        let second = dispatch("ARRAY['many'], 6, 'w'");
        assert_eq!(
            kinds(&second),
            vec!["s67_1", "s68_1", "s69_1", "s70_1", "b1", "b2"]
        );
        // mid-row: the rest of the batch, and then nothing
        assert_eq!(
            kinds(&dispatch("ARRAY['many'], 10, 'w'")),
            vec!["b3", "b4", "b5"]
        );
        assert!(dispatch("ARRAY['many'], 10, 'w'").is_empty());
        assert_eq!(complete_many(&first), 66);
        assert_eq!(complete_many(&first), 0, "a second completion is refused");
        // part of a claim, then all of it: only the rest is completed
        assert_eq!(complete_many(&second[..3]), 3);
        assert_eq!(complete_many(&second), 3);
        assert_eq!(complete_many(&second), 0);
        assert_eq!(
            count(
                "SELECT count(*) FROM pgque.all_jobs WHERE queue = 'many' AND state = 'completed'"
            ),
            72
        );
    }

    #[pg_test]
    fn repeatable_read_dispatch_of_the_log_is_refused() {
        run("SELECT pgque.create_job_queue('iso')");
        enqueue("iso", "k", 1, "");
        // the test's transaction is READ COMMITTED; a subtransaction cannot
        // change the level, so only the check itself is exercised here
        assert!(!crate::jobs::log::xact_snapshot());
        assert_eq!(dispatch("ARRAY['iso'], 1, 'w'").len(), 1);
    }

    // ---- plan shape: depth independence of the log's dispatch --------------

    #[pg_test]
    fn log_dispatch_plan_is_bounded_by_limit_at_30k_ready_jobs() {
        let limit = 50;
        run("SELECT pgque.create_job_queue('deep')");
        for _ in 0..300 {
            enqueue("deep", "k", 100, "");
        }
        // a rate limit that admits every call's whole limit: dispatch locks
        // and debits the bucket on every call below (plans of those two
        // statements among many buckets: rate_tests.rs)
        run("SELECT pgque.set_rate_limit('deep', 1000000, '1 second')");
        let lanes = one::<Vec<i32>>("SELECT array_agg(lane_id) FROM pgque.job_lanes").unwrap();
        let lanes = format!("ARRAY{lanes:?}");
        for analyzed in [false, true] {
            if analyzed {
                run("ANALYZE pgque.job_log, pgque.job_claims, pgque.job_lanes");
            }
            for generic in [false, true] {
                // the lane and bucket locks: one lane row, one bucket row
                let sql = crate::jobs::log::dispatch::LOCK_LANES_SQL;
                prepare_d("text[]", sql, generic);
                let (widest, returned) = explain_widest("EXECUTE d(ARRAY['deep'])");
                assert_eq!(returned, 1.0, "lock: generic={generic} analyzed={analyzed}");
                assert!(widest <= 4.0, "lock: a node processed {widest} rows");
                let sql = crate::jobs::log::dispatch::LOG_DISPATCH_SQL;
                prepare_d("text[], int, text, interval, int[]", sql, generic);
                let (widest, returned) = explain_widest(&format!(
                    "EXECUTE d(ARRAY['deep'], {limit}, 'w', NULL, {lanes})"
                ));
                assert_eq!(
                    returned, limit as f64,
                    "generic={generic} analyzed={analyzed}"
                );
                // a dispatch unpacks at most limit + one row's jobs (rows a
                // node read and filtered out count too)
                let bound = (2 * limit + crate::jobs::log::enqueue::ROW_MAX) as f64;
                assert!(
                    widest <= bound,
                    "generic={generic} analyzed={analyzed}: a node processed {widest} rows (bound {bound})"
                );
                // the one-lane path: the lane state and its first log rows,
                // then more log rows, each an index range stopped by the limit
                let sql = crate::jobs::log::dispatch::LANE_STATE_SQL;
                prepare_d("text[], int, text, interval, int[], bigint", sql, generic);
                let (widest, returned) = explain_widest(&format!(
                    "EXECUTE d(ARRAY['deep'], {limit}, 'w', NULL, {lanes}, 2)"
                ));
                assert_eq!(
                    returned, 2.0,
                    "lane state: generic={generic} analyzed={analyzed}"
                );
                // (a few: the segments' index scans, the queue and lane rows)
                assert!(widest <= 8.0, "lane state: a node processed {widest} rows");
                let sql = crate::jobs::log::dispatch::LANE_ROWS_SQL;
                prepare_d("int, bigint, bigint", sql, generic);
                let lane = lanes.trim_start_matches("ARRAY[").trim_end_matches(']');
                let (widest, returned) = explain_widest(&format!("EXECUTE d({lane}, 0, 2)"));
                assert_eq!(
                    returned, 2.0,
                    "lane rows: generic={generic} analyzed={analyzed}"
                );
                // a merge of the three segments' index scans reads at most
                // the limit from each
                assert!(widest <= 6.0, "lane rows: a node processed {widest} rows");
            }
        }
        // ... and still exactly limit after 29k more were dispatched (the
        // four EXPLAIN ANALYZE runs of LOG_DISPATCH_SQL above claimed 200)
        for _ in 0..580 {
            dispatch("ARRAY['deep'], 50, 'w'");
        }
        assert_eq!(dispatch("ARRAY['deep'], 50, 'w'").len(), 50);
        // (the bucket was debited by every pgque.dispatch call: 29,050 jobs)
        assert_eq!(
            one::<f64>("SELECT round(1000000 - tokens) FROM pgque.job_rate_limits"),
            Some(29_050.0)
        );
        assert_eq!(
            count("SELECT count(*) FROM pgque.all_jobs WHERE state = 'ready'"),
            30_000 - 200 - 29_000 - 50
        );
    }
}
