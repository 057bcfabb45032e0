//! In-server tests of job outputs, progress and cancellation as the worker
//! sees it (each in a rolled-back transaction), for jobs of the log and of
//! pgque.jobs.
use pgrx::prelude::*;

#[pg_schema]
mod tests {
    use crate::jobs::tests::tests::{count, one, run, side_store, sqlstate};
    use pgrx::prelude::*;

    /// (job_id, lease_token) of a dispatch of `n` jobs from `queue`.
    fn dispatch(queue: &str, n: i32) -> Vec<(i64, i64)> {
        Spi::connect(|c| {
            c.select(
                &format!(
                    "SELECT job_id, lease_token FROM pgque.dispatch(ARRAY['{queue}'], {n}, 'w')"
                ),
                None,
                &[],
            )
            .unwrap()
            .map(|r| {
                (
                    r.get::<i64>(1).unwrap().unwrap(),
                    r.get::<i64>(2).unwrap().unwrap(),
                )
            })
            .collect()
        })
    }

    fn enqueue(queue: &str, n: i32) {
        run(&format!(
            "SELECT count(*) FROM pgque.enqueue_ready_rows('{queue}',
                 (SELECT array_agg('k' || i ORDER BY i) FROM generate_series(1, {n}) i),
                 (SELECT array_agg(jsonb_build_object('i', i) ORDER BY i) FROM generate_series(1, {n}) i))"
        ));
    }

    /// output / progress / state / stored_in of a job, as get_job shows it;
    /// also checks that all_jobs shows the same.
    fn shown(id: i64) -> String {
        let q = "COALESCE(output::text, '-') || ' ' || COALESCE(progress::text, '-') || ' ' || state || ' ' || stored_in";
        let g = one::<String>(&format!("SELECT {q} FROM pgque.get_job({id})")).unwrap();
        let a = one::<String>(&format!("SELECT {q} FROM pgque.all_jobs WHERE id = {id}")).unwrap();
        assert_eq!(g, a, "get_job and all_jobs differ for job {id}");
        g
    }

    /// Updates and deletes this transaction made in the log's partitions,
    /// and its inserts into done and progress rows.
    fn log_writes() -> (i64, i64, i64) {
        let base = "FROM pg_catalog.pg_stat_xact_user_tables WHERE schemaname = 'pgque'";
        (
            count(&format!(
                "SELECT COALESCE(sum(n_tup_upd + n_tup_del), 0)::bigint {base}
                   AND relname ~ '^job_(log|claims|done|progress)_[0-2]$'"
            )),
            count(&format!(
                "SELECT COALESCE(sum(n_tup_ins), 0)::bigint {base} AND relname ~ '^job_done_[0-2]$'"
            )),
            count(&format!(
                "SELECT COALESCE(sum(n_tup_ins), 0)::bigint {base} AND relname ~ '^job_progress_[0-2]$'"
            )),
        )
    }

    /// In the log an output is part of the done row and progress an appended
    /// row: dispatch, progress and every completion path (a whole claim, a
    /// part of one, a single complete) update and delete nothing there.
    #[pg_test]
    fn log_outputs_and_progress_are_appended_never_updated() {
        run("SELECT pgque.create_job_queue('lo')");
        enqueue("lo", 6);
        let a = dispatch("lo", 3);
        let b = dispatch("lo", 2);
        let c = dispatch("lo", 1);
        assert_eq!(
            count("SELECT count(*) FROM pgque.all_jobs WHERE stored_in = 'log'"),
            6
        );
        // progress twice: the last one is shown
        for p in ["1", "2"] {
            assert_eq!(
                one::<bool>(&format!(
                    "SELECT pgque.set_progress({}, {}, '{{\"step\": {p}}}')",
                    a[0].0, a[0].1
                )),
                Some(true)
            );
        }
        assert_eq!(shown(a[0].0), "- {\"step\": 2} running log");
        // the whole claim a, pairs given out of order, one output NULL
        assert_eq!(
            one::<i32>(&format!(
                "SELECT pgque.complete_many(ARRAY[{}, {}, {}], ARRAY[{}, {}, {}],
                                            ARRAY['\"r2\"', NULL, '\"r0\"']::jsonb[])",
                a[2].0, a[1].0, a[0].0, a[2].1, a[1].1, a[0].1
            )),
            Some(3)
        );
        assert_eq!(shown(a[0].0), "\"r0\" {\"step\": 2} completed log");
        assert_eq!(shown(a[1].0), "- - completed log");
        assert_eq!(shown(a[2].0), "\"r2\" - completed log");
        // part of claim b (the matching path), then the rest without outputs
        assert_eq!(
            one::<i32>(&format!(
                "SELECT pgque.complete_many(ARRAY[{}], ARRAY[{}], ARRAY['{{\"n\": 1}}']::jsonb[])",
                b[1].0, b[1].1
            )),
            Some(1)
        );
        assert_eq!(
            one::<bool>(&format!("SELECT pgque.complete({}, {})", b[0].0, b[0].1)),
            Some(true)
        );
        assert_eq!(shown(b[1].0), "{\"n\": 1} - completed log");
        assert_eq!(shown(b[0].0), "- - completed log");
        // a single complete with an output
        assert_eq!(
            one::<bool>(&format!(
                "SELECT pgque.complete({}, {}, '[1, 2]')",
                c[0].0, c[0].1
            )),
            Some(true)
        );
        assert_eq!(shown(c[0].0), "[1, 2] - completed log");
        // a second completion is refused and keeps the first output
        assert_eq!(
            one::<bool>(&format!(
                "SELECT pgque.complete({}, {}, '\"again\"')",
                c[0].0, c[0].1
            )),
            Some(false)
        );
        assert_eq!(shown(c[0].0), "[1, 2] - completed log");
        let (changed, done_rows, progress_rows) = log_writes();
        assert_eq!(changed, 0, "updates or deletes in the job log's tables");
        // the counters do count this transaction: 4 done rows, 2 progress rows
        assert_eq!((done_rows, progress_rows), (4, 2));
        assert_eq!(count("SELECT count(*) FROM pgque.jobs"), 0);
    }

    /// pgque.jobs' jobs record outputs and progress in their row.
    #[pg_test]
    fn side_outputs_and_progress() {
        side_store();
        run("SELECT pgque.create_job_queue('so')");
        enqueue("so", 3);
        let d = dispatch("so", 3);
        assert_eq!(
            one::<bool>(&format!(
                "SELECT pgque.set_progress({}, {}, '{{\"pct\": 50}}')",
                d[0].0, d[0].1
            )),
            Some(true)
        );
        assert_eq!(shown(d[0].0), "- {\"pct\": 50} running jobs");
        assert_eq!(
            one::<bool>(&format!(
                "SELECT pgque.complete({}, {}, '{{\"ok\": true}}')",
                d[0].0, d[0].1
            )),
            Some(true)
        );
        assert_eq!(shown(d[0].0), "{\"ok\": true} {\"pct\": 50} completed jobs");
        assert_eq!(
            one::<i32>(&format!(
                "SELECT pgque.complete_many(ARRAY[{}, {}], ARRAY[{}, {}], ARRAY[NULL, '7']::jsonb[])",
                d[1].0, d[2].0, d[1].1, d[2].1
            )),
            Some(2)
        );
        assert_eq!(shown(d[1].0), "- - completed jobs");
        assert_eq!(shown(d[2].0), "7 - completed jobs");
        // a finished job takes no progress
        assert_eq!(
            one::<bool>(&format!(
                "SELECT pgque.set_progress({}, {}, '1')",
                d[2].0, d[2].1
            )),
            Some(false)
        );
    }

    /// The caps (54000) and the argument checks change nothing.
    #[pg_test]
    fn outputs_and_progress_are_capped() {
        run("SELECT pgque.create_job_queue('cap')");
        enqueue("cap", 2);
        let d = dispatch("cap", 2);
        let big = format!("jsonb_build_object('x', repeat('a', {}))", 1024 * 1024 + 1);
        assert_eq!(
            sqlstate(&format!(
                "SELECT pgque.complete({}, {}, {big})",
                d[0].0, d[0].1
            )),
            "54000"
        );
        assert_eq!(
            sqlstate(&format!(
                "SELECT pgque.complete_many(ARRAY[{}, {}], ARRAY[{}, {}], ARRAY[NULL, {big}])",
                d[0].0, d[1].0, d[0].1, d[1].1
            )),
            "54000"
        );
        assert_eq!(
            sqlstate(&format!(
                "SELECT pgque.complete_many(ARRAY[{}], ARRAY[{}], ARRAY['1', '2']::jsonb[])",
                d[0].0, d[0].1
            )),
            "22023"
        );
        let big_progress = format!("jsonb_build_object('x', repeat('a', {}))", 64 * 1024 + 1);
        assert_eq!(
            sqlstate(&format!(
                "SELECT pgque.set_progress({}, {}, {big_progress})",
                d[0].0, d[0].1
            )),
            "54000"
        );
        assert_eq!(
            sqlstate(&format!(
                "SELECT pgque.set_progress({}, {}, NULL)",
                d[0].0, d[0].1
            )),
            "22004"
        );
        // an output just under the cap is kept
        let fits = format!("jsonb_build_object('x', repeat('a', {}))", 1024 * 1000);
        assert_eq!(
            one::<bool>(&format!(
                "SELECT pgque.complete({}, {}, {fits})",
                d[1].0, d[1].1
            )),
            Some(true)
        );
        assert_eq!(
            count(&format!(
                "SELECT length(output->>'x')::bigint FROM pgque.get_job({})",
                d[1].0
            )),
            1024 * 1000
        );
        // nothing of the refused calls happened
        assert_eq!(shown(d[0].0), "- - running log");
    }

    /// A running job that is cancelled: its worker's next heartbeat leaves it
    /// out, set_progress and complete return false, its batch siblings go
    /// on. In the log (a claim of two) and in pgque.jobs.
    #[pg_test]
    fn cancellation_is_seen_by_the_worker() {
        for (queue, side) in [("cl", false), ("cs", true)] {
            if side {
                side_store();
            }
            run(&format!("SELECT pgque.create_job_queue('{queue}')"));
            enqueue(queue, 2);
            let d = dispatch(queue, 2);
            assert_eq!(
                one::<bool>(&format!(
                    "SELECT pgque.set_progress({}, {}, '\"half\"')",
                    d[0].0, d[0].1
                )),
                Some(true)
            );
            assert_eq!(
                one::<bool>(&format!("SELECT pgque.cancel({})", d[0].0)),
                Some(true)
            );
            let beat = one::<String>(&format!(
                "SELECT string_agg(job_id::text, ',' ORDER BY job_id)
                 FROM pgque.heartbeat(ARRAY[{}, {}], ARRAY[{}, {}], '1 minute')",
                d[0].0, d[1].0, d[0].1, d[1].1
            ));
            assert_eq!(beat, Some(d[1].0.to_string()), "{queue}: heartbeat");
            assert_eq!(
                one::<bool>(&format!(
                    "SELECT pgque.set_progress({}, {}, '1')",
                    d[0].0, d[0].1
                )),
                Some(false),
                "{queue}: set_progress"
            );
            assert_eq!(
                one::<bool>(&format!(
                    "SELECT pgque.complete({}, {}, '1')",
                    d[0].0, d[0].1
                )),
                Some(false),
                "{queue}: complete"
            );
            assert_eq!(
                one::<String>(&format!(
                    "SELECT pgque.fail({}, {}, 'late')",
                    d[0].0, d[0].1
                )),
                None,
                "{queue}: fail"
            );
            assert_eq!(
                one::<i32>(&format!(
                    "SELECT pgque.complete_many(ARRAY[{}, {}], ARRAY[{}, {}])",
                    d[0].0, d[1].0, d[0].1, d[1].1
                )),
                Some(1),
                "{queue}: complete_many completes the sibling only"
            );
            // the cancelled job keeps the progress it had reported
            assert_eq!(shown(d[0].0), "- \"half\" cancelled jobs");
            assert!(shown(d[1].0).starts_with("- - completed"));
        }
    }

    /// A log job that leaves its claim for pgque.jobs (a failed attempt, a
    /// rescued lease) takes its last progress along; a stale token records
    /// nothing.
    #[pg_test]
    fn progress_moves_with_the_job() {
        run("SELECT pgque.create_job_queue('pm')");
        enqueue("pm", 1);
        let d = dispatch("pm", 1);
        assert_eq!(
            one::<bool>(&format!(
                "SELECT pgque.set_progress({}, {}, '{{\"at\": 3}}')",
                d[0].0, d[0].1
            )),
            Some(true)
        );
        assert_eq!(
            one::<bool>(&format!(
                "SELECT pgque.set_progress({}, {}, '1')",
                d[0].0,
                d[0].1 + 1000
            )),
            Some(false)
        );
        assert_eq!(
            one::<String>(&format!(
                "SELECT pgque.fail({}, {}, 'boom', now())",
                d[0].0, d[0].1
            )),
            Some("ready".into())
        );
        assert_eq!(shown(d[0].0), "- {\"at\": 3} ready jobs");
        // the next attempt reports and completes in pgque.jobs
        let e = dispatch("pm", 1);
        assert_eq!(e[0].0, d[0].0);
        assert_eq!(
            one::<bool>(&format!(
                "SELECT pgque.set_progress({}, {}, '{{\"at\": 9}}')",
                e[0].0, e[0].1
            )),
            Some(true)
        );
        assert_eq!(
            one::<bool>(&format!(
                "SELECT pgque.complete({}, {}, '\"done\"')",
                e[0].0, e[0].1
            )),
            Some(true)
        );
        assert_eq!(shown(d[0].0), "\"done\" {\"at\": 9} completed jobs");
    }
}
