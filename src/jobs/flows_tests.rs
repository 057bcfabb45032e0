//! In-server tests of flows (each in a rolled-back transaction, one
//! session); pg_test/tests/jobs_flows.rs has the races between sessions.
use pgrx::prelude::*;

#[pg_schema]
mod tests {
    use crate::jobs::tests::tests::{count, explain_widest, one, run, sqlstate};
    use pgrx::prelude::*;

    /// (key, job_id) of an enqueue_flow, and the flow id.
    fn flow(queue: &str, jobs: &str) -> (i64, Vec<(String, i64)>) {
        let rows: Vec<(i64, String, i64)> = Spi::connect(|c| {
            c.select(
                &format!(
                    "SELECT flow_id, key, job_id FROM pgque.enqueue_flow('{queue}', '{jobs}')"
                ),
                None,
                &[],
            )
            .unwrap()
            .map(|r| {
                (
                    r.get::<i64>(1).unwrap().unwrap(),
                    r.get::<String>(2).unwrap().unwrap(),
                    r.get::<i64>(3).unwrap().unwrap(),
                )
            })
            .collect()
        });
        (rows[0].0, rows.into_iter().map(|r| (r.1, r.2)).collect())
    }

    fn id(jobs: &[(String, i64)], key: &str) -> i64 {
        jobs.iter().find(|j| j.0 == key).unwrap().1
    }

    fn state(id: i64) -> String {
        one::<String>(&format!("SELECT state FROM pgque.get_job({id})")).unwrap()
    }

    /// Dispatches everything ready in `queue` (up to 1000); returns (id, token) pairs.
    fn dispatch(queue: &str) -> Vec<(i64, i64)> {
        dispatch_n(queue, 1000)
    }

    fn dispatch_n(queue: &str, n: i32) -> Vec<(i64, i64)> {
        Spi::connect(|c| {
            c.select(
                &format!("SELECT job_id, lease_token FROM pgque.dispatch(ARRAY['{queue}'], {n}, 'w') ORDER BY job_id"),
                None,
                &[],
            )
            .unwrap()
            .map(|r| (r.get::<i64>(1).unwrap().unwrap(), r.get::<i64>(2).unwrap().unwrap()))
            .collect()
        })
    }

    fn complete(job: (i64, i64), output: &str) -> bool {
        one::<bool>(&format!(
            "SELECT pgque.complete({}, {}, '{output}')",
            job.0, job.1
        ))
        .unwrap()
    }

    #[pg_test]
    fn a_flow_runs_in_dependency_order() {
        run("SELECT pgque.create_job_queue('fq')");
        let (fid, jobs) = flow(
            "fq",
            r#"[{"key": "a", "kind": "fetch", "args": {"u": 1}},
                {"key": "b", "kind": "left", "depends_on": ["a"]},
                {"key": "c", "kind": "right", "depends_on": ["a"], "priority": 5},
                {"key": "d", "kind": "join", "depends_on": ["b", "c"]}]"#,
        );
        assert_eq!(
            jobs.iter().map(|j| j.0.as_str()).collect::<Vec<_>>(),
            ["a", "b", "c", "d"]
        );
        let (a, b, c, d) = (
            id(&jobs, "a"),
            id(&jobs, "b"),
            id(&jobs, "c"),
            id(&jobs, "d"),
        );
        assert_eq!(
            [state(a), state(b), state(c), state(d)],
            ["ready", "waiting", "waiting", "waiting"]
        );
        assert_eq!(
            one::<String>("SELECT waiting || '/' || ready FROM pgque.job_queue_status WHERE queue_name = 'fq'"),
            Some("3/1".into())
        );
        assert_eq!(
            one::<String>(&format!(
                "SELECT total || '/' || waiting || '/' || ready FROM pgque.flow_status({fid})"
            )),
            Some("4/3/1".into())
        );
        // only a is dispatched; its completion readies b and c, not d
        let got = dispatch("fq");
        assert_eq!(got.iter().map(|g| g.0).collect::<Vec<_>>(), vec![a]);
        assert!(complete(got[0], r#"{"rows": 7}"#));
        assert_eq!(
            [state(b), state(c), state(d)],
            ["ready", "ready", "waiting"]
        );
        // the children read their parent's output
        assert_eq!(
            one::<String>(&format!(
                "SELECT string_agg(job_id || ' ' || key || ' ' || state || ' ' || output::text, ',')
                 FROM pgque.job_parents({b})"
            )),
            Some(format!("{a} a completed {{\"rows\": 7}}"))
        );
        let got = dispatch("fq");
        assert_eq!(got.iter().map(|g| g.0).collect::<Vec<_>>(), vec![b, c]);
        assert!(complete(got[0], "1"));
        assert_eq!(state(d), "waiting", "one parent of d is still running");
        assert_eq!(dispatch("fq"), vec![]);
        assert!(complete(got[1], "2"));
        assert_eq!(state(d), "ready");
        assert_eq!(
            one::<String>(&format!(
                "SELECT string_agg(key || ' ' || state, ',' ORDER BY key) FROM pgque.job_parents({d})"
            )),
            Some("b completed,c completed".into())
        );
        let got = dispatch("fq");
        assert!(complete(got[0], "3"));
        assert_eq!(
            one::<String>(&format!(
                "SELECT total || '/' || completed || '/' || waiting FROM pgque.flow_status({fid})"
            )),
            Some("4/4/0".into())
        );
        assert_eq!(
            count("SELECT count(*) FROM pgque.flow_status(987654321)"),
            0
        );
    }

    /// A parent that fails cancels its waiting descendants (each error names
    /// its parent); a child that says "run" runs anyway; cancel of a job
    /// does the same.
    #[pg_test]
    fn failure_and_cancellation_propagate_to_waiting_descendants() {
        run("SELECT pgque.create_job_queue('pf')");
        let (_, jobs) = flow(
            "pf",
            r#"[{"key": "a", "kind": "k", "max_attempts": 1},
                {"key": "b", "kind": "k", "depends_on": ["a"]},
                {"key": "c", "kind": "k", "depends_on": ["b"]},
                {"key": "r", "kind": "k", "depends_on": ["a"], "on_parent_failure": "run"}]"#,
        );
        let (a, b, c, r) = (
            id(&jobs, "a"),
            id(&jobs, "b"),
            id(&jobs, "c"),
            id(&jobs, "r"),
        );
        let got = dispatch("pf");
        assert_eq!(
            one::<String>(&format!(
                "SELECT pgque.fail({}, {}, 'boom')",
                got[0].0, got[0].1
            )),
            Some("failed".into())
        );
        assert_eq!(
            [state(a), state(b), state(c), state(r)],
            ["failed", "cancelled", "cancelled", "ready"]
        );
        assert_eq!(
            one::<String>(&format!(
                "SELECT errors->0->>'error' FROM pgque.get_job({b})"
            )),
            Some(format!("parent {a} failed"))
        );
        assert_eq!(
            one::<String>(&format!(
                "SELECT errors->0->>'error' FROM pgque.get_job({c})"
            )),
            Some(format!("parent {b} cancelled"))
        );
        // cancel: of a waiting job, and of a running parent
        let (_, jobs) = flow(
            "pf",
            r#"[{"key": "p", "kind": "k"}, {"key": "q", "kind": "k", "depends_on": ["p"]},
                {"key": "s", "kind": "k", "depends_on": ["q"]}]"#,
        );
        let (p, q, s) = (id(&jobs, "p"), id(&jobs, "q"), id(&jobs, "s"));
        assert_eq!(
            one::<bool>(&format!("SELECT pgque.cancel({q})")),
            Some(true)
        );
        assert_eq!(
            [state(p), state(q), state(s)],
            ["ready", "cancelled", "cancelled"]
        );
        let (_, jobs) = flow(
            "pf",
            r#"[{"key": "p", "kind": "k"}, {"key": "q", "kind": "k", "depends_on": ["p"]}]"#,
        );
        let (p, q) = (id(&jobs, "p"), id(&jobs, "q"));
        let got = dispatch("pf");
        assert!(got.iter().any(|g| g.0 == p));
        assert_eq!(
            one::<bool>(&format!("SELECT pgque.cancel({p})")),
            Some(true)
        );
        assert_eq!(state(q), "cancelled");
        assert_eq!(
            one::<String>(&format!(
                "SELECT errors->0->>'error' FROM pgque.get_job({q})"
            )),
            Some(format!("parent {p} cancelled"))
        );
    }

    #[pg_test]
    fn bad_flows_are_refused_and_enqueue_nothing() {
        run("SELECT pgque.create_job_queue('bf')");
        let before = count("SELECT count(*) FROM pgque.jobs");
        for (jobs, code) in [
            (r#"{"key": "a"}"#, "22023"),
            ("[]", "22023"),
            (r#"[{"key": "a", "kind": "k", "dependson": []}]"#, "42703"),
            (
                r#"[{"key": "a", "kind": "k"}, {"key": "a", "kind": "k"}]"#,
                "42710",
            ),
            (
                r#"[{"key": "a", "kind": "k", "depends_on": ["x"]}]"#,
                "42704",
            ),
            (
                r#"[{"key": "a", "kind": "k", "depends_on": ["b"]}, {"key": "b", "kind": "k", "depends_on": ["a"]}]"#,
                "42P19",
            ),
            (r#"[{"key": "a", "kind": "k", "priority": 5000}]"#, "22003"),
            (r#"[{"key": "a", "kind": "k", "run_at": "soon"}]"#, "22007"),
            (r#"[{"key": "a", "kind": "k", "unique_key": "u"}]"#, "0A000"),
        ] {
            assert_eq!(
                sqlstate(&format!("SELECT * FROM pgque.enqueue_flow('bf', '{jobs}')")),
                code,
                "{jobs}"
            );
        }
        assert_eq!(
            sqlstate(r#"SELECT * FROM pgque.enqueue_flow('nope', '[{"key": "a", "kind": "k"}]')"#),
            "42704"
        );
        assert_eq!(
            sqlstate("SELECT * FROM pgque.enqueue_flow('bf', NULL)"),
            "22004"
        );
        assert_eq!(
            sqlstate("SELECT pgque.enqueue('bf', 'k', depends_on => ARRAY[987654321]::bigint[])"),
            "42704"
        );
        assert_eq!(
            sqlstate("SELECT pgque.enqueue('bf', 'k', depends_on => ARRAY[NULL]::bigint[])"),
            "22004"
        );
        assert_eq!(count("SELECT count(*) FROM pgque.jobs"), before);
        assert_eq!(count("SELECT count(*) FROM pgque.job_deps"), 0);
    }

    /// enqueue(..., depends_on) behind existing jobs: the writer's call links
    /// nothing on the parents' side (a running log parent stays in the log);
    /// job_maint then moves it into pgque.jobs, a completed log job counts as
    /// done, a failed one cancels the new job.
    #[pg_test]
    fn enqueue_behind_existing_jobs() {
        run("SELECT pgque.create_job_queue('dq')");
        let l1 = one::<i64>("SELECT pgque.enqueue('dq', 'l1')").unwrap();
        let l2 = one::<i64>("SELECT pgque.enqueue('dq', 'l2')").unwrap();
        assert_eq!(
            one::<String>(&format!("SELECT stored_in FROM pgque.get_job({l1})")),
            Some("log".into())
        );
        let got = dispatch("dq");
        assert_eq!(got.len(), 2);
        assert!(complete(got[0], "\"l1 done\""));
        // l1 completed in the log, l2 runs there
        let child = one::<i64>(&format!(
            "SELECT pgque.enqueue('dq', 'child', depends_on => ARRAY[{l1}, {l2}])"
        ))
        .unwrap();
        assert_eq!(state(child), "waiting");
        let stored = |id: i64| {
            one::<String>(&format!(
                "SELECT stored_in || ' ' || state FROM pgque.get_job({id})"
            ))
        };
        assert_eq!(stored(l2), Some("log running".into()));
        assert_eq!(count("SELECT count(*) FROM pgque.job_links"), 1);
        run("SELECT pgque.job_maint()");
        assert_eq!(count("SELECT count(*) FROM pgque.job_links"), 0);
        assert_eq!(stored(l2), Some("jobs running".into()));
        assert_eq!(state(child), "waiting");
        // l2's worker completes it under its token: the child is ready
        assert!(complete(got[1], "2"));
        assert_eq!(state(child), "ready");
        assert_eq!(
            one::<String>(&format!(
                "SELECT string_agg(job_id || ' ' || state || ' ' || output::text, ',' ORDER BY job_id)
                 FROM pgque.job_parents({child})"
            )),
            Some(format!("{l1} completed \"l1 done\",{l2} completed 2"))
        );
        // behind a completed job only: ready at once
        let c2 = one::<i64>(&format!(
            "SELECT pgque.enqueue('dq', 'c2', depends_on => ARRAY[{l1}])"
        ))
        .unwrap();
        assert_eq!(state(c2), "ready");
        assert_eq!(count("SELECT count(*) FROM pgque.job_links"), 0);
        // behind a failed job: cancelled at once
        let f = one::<i64>("SELECT pgque.enqueue('dq', 'f', max_attempts => 1)").unwrap();
        let got: Vec<(i64, i64)> = dispatch("dq").into_iter().filter(|g| g.0 == f).collect();
        run(&format!(
            "SELECT pgque.fail({}, {}, 'x')",
            got[0].0, got[0].1
        ));
        let c3 = one::<i64>(&format!(
            "SELECT pgque.enqueue('dq', 'c3', depends_on => ARRAY[{f}])"
        ))
        .unwrap();
        assert_eq!(state(c3), "waiting");
        run("SELECT pgque.job_maint()");
        assert_eq!(state(c3), "cancelled");
    }

    /// depends_on is capped like complete_many's arrays (54000), and its
    /// run_at and a flow's must be finite (22023): an infinite run_at made
    /// every status view fail.
    #[pg_test]
    fn depends_on_is_capped_and_times_are_finite() {
        run("SELECT pgque.create_job_queue('cq')");
        let p = one::<i64>("SELECT pgque.enqueue('cq', 'p')").unwrap();
        assert_eq!(
            sqlstate(&format!(
                "SELECT pgque.enqueue('cq', 'k', depends_on => array_fill({p}::bigint, ARRAY[10001]))"
            )),
            "54000"
        );
        for t in ["infinity", "-infinity"] {
            assert_eq!(
                sqlstate(&format!(
                    r#"SELECT * FROM pgque.enqueue_flow('cq', '[{{"key": "a", "kind": "k", "run_at": "{t}"}}]')"#
                )),
                "22023",
                "{t}"
            );
            assert_eq!(
                sqlstate(&format!(
                    "SELECT pgque.enqueue('cq', 'k', run_at => '{t}', depends_on => ARRAY[{p}])"
                )),
                "22023",
                "{t}"
            );
        }
        assert_eq!(count("SELECT count(*) FROM pgque.job_links"), 0);
    }

    /// A 10,000-job flow (1 -> 9,998 -> 1) is one call; the fan-in job is
    /// made ready by the completion of the last of its 9,998 parents.
    #[pg_test]
    fn a_ten_thousand_job_flow() {
        run("SELECT pgque.create_job_queue('big')");
        let n = count(
            r#"SELECT count(*) FROM pgque.enqueue_flow('big',
                 jsonb_build_array(jsonb_build_object('key', 'root', 'kind', 'split'))
                 || (SELECT jsonb_agg(jsonb_build_object('key', 'm' || i, 'kind', 'map', 'args', jsonb_build_object('i', i),
                                                          'depends_on', jsonb_build_array('root')))
                     FROM generate_series(1, 9998) i)
                 || jsonb_build_array(jsonb_build_object('key', 'end', 'kind', 'reduce',
                        'depends_on', (SELECT jsonb_agg('m' || i) FROM generate_series(1, 9998) i))))"#,
        );
        assert_eq!(n, 10_000);
        assert_eq!(count("SELECT count(*) FROM pgque.job_deps"), 2 * 9998);
        let root = dispatch("big");
        assert_eq!(root.len(), 1);
        assert!(complete(root[0], "0"));
        assert_eq!(
            count("SELECT count(*) FROM pgque.jobs WHERE queue = 'big' AND state = 'ready'"),
            9998
        );
        let end = count("SELECT id FROM pgque.jobs WHERE queue = 'big' AND flow_key = 'end'");
        // big calls: the test stays short (its transaction holds the log's
        // relation locks, which the rotation tests beside it need)
        loop {
            let got = dispatch_n("big", 10000);
            if got.is_empty() {
                break;
            }
            let ids: Vec<String> = got.iter().map(|g| g.0.to_string()).collect();
            let toks: Vec<String> = got.iter().map(|g| g.1.to_string()).collect();
            run(&format!(
                "SELECT pgque.complete_many(ARRAY[{}]::bigint[], ARRAY[{}]::bigint[])",
                ids.join(","),
                toks.join(",")
            ));
            if got.iter().any(|g| g.0 == end) {
                break;
            }
        }
        assert_eq!(state(end), "completed");
        assert_eq!(
            count("SELECT count(*) FROM pgque.jobs WHERE queue = 'big' AND state <> 'completed'"),
            0
        );
    }

    // ---- plan shape: readying or cancelling n children reads each once ----

    /// Enqueues r -> `n` middles -> s into `queue`; returns r's id and the
    /// middles' ids as an SQL array literal.
    fn fan(queue: &str, n: i32) -> (i64, String) {
        run(&format!("SELECT pgque.create_job_queue('{queue}')"));
        run(&format!(
            r#"SELECT count(*) FROM pgque.enqueue_flow('{queue}',
                 jsonb_build_array(jsonb_build_object('key', 'r', 'kind', 'root'))
                 || (SELECT jsonb_agg(jsonb_build_object('key', 'm' || i, 'kind', 'mid',
                                                          'depends_on', jsonb_build_array('r')))
                     FROM generate_series(1, {n}) i)
                 || jsonb_build_array(jsonb_build_object('key', 's', 'kind', 'sink',
                        'depends_on', (SELECT jsonb_agg('m' || i) FROM generate_series(1, {n}) i))))"#
        ));
        let root = count(&format!(
            "SELECT id FROM pgque.jobs WHERE queue = '{queue}' AND flow_key = 'r'"
        ));
        let mids = one::<String>(&format!(
            "SELECT array_agg(id ORDER BY id)::text FROM pgque.jobs WHERE queue = '{queue}' AND kind = 'mid'"
        ))
        .unwrap();
        (root, mids)
    }

    /// The statements that count children down, make them ready and cancel
    /// them (RELEASE_SQL, WAKE_SQL, PROPAGATE_SQL) read each child a bounded
    /// number of times whatever the fan-out: planned generically (under
    /// FLOW_PLAN_SETTINGS) on a 3-job flow and run on a fan-out of 1,000,
    /// then planned again after ANALYZE, no plan node processes more than 3
    /// rows per child. (Under the job statements' settings alone, WAKE_SQL
    /// joined the children by a nested loop whose inner side scanned all
    /// their ids again per child: 1,000,000 rows for 1,000, and 9.4 s to
    /// make 8,000 children ready.)
    #[pg_test]
    fn readying_and_cancelling_children_is_linear_in_their_number() {
        let n = 1000;
        let bound = 3.0 * n as f64;
        let (tiny_root, tiny_mids) = fan("fan_tiny", 1);
        for (name, value) in crate::jobs::flows::FLOW_PLAN_SETTINGS {
            run(&format!(
                "SET LOCAL {} = {}",
                name.to_str().unwrap(),
                value.to_str().unwrap()
            ));
        }
        run("DEALLOCATE ALL");
        run(&format!(
            "PREPARE rel(bigint[]) AS {}",
            crate::jobs::flows::RELEASE_SQL
        ));
        run(&format!(
            "PREPARE wake(bigint[]) AS {}",
            crate::jobs::flows::WAKE_SQL
        ));
        run(&format!(
            "PREPARE prop(bigint[], text) AS {}",
            crate::jobs::flows::PROPAGATE_SQL
        ));
        // the generic plans are made now, on 3 jobs
        explain_widest(&format!("EXECUTE rel(ARRAY[{tiny_root}]::bigint[])"));
        explain_widest(&format!("EXECUTE wake('{tiny_mids}'::bigint[])"));
        explain_widest("EXECUTE prop(ARRAY[0]::bigint[], 'failed')");
        for round in ["planned on 3 jobs", "after ANALYZE"] {
            if round == "after ANALYZE" {
                run("ANALYZE pgque.jobs");
                run("ANALYZE pgque.job_deps");
            }
            let tag = if round == "after ANALYZE" { "b" } else { "a" };
            let (root, mids) = fan(&format!("fan_ready_{tag}"), n);
            let (widest, _) = explain_widest(&format!("EXECUTE rel(ARRAY[{root}]::bigint[])"));
            assert!(
                widest <= bound,
                "{round}: counting {n} children down processed {widest} rows in one node"
            );
            let (widest, _) = explain_widest(&format!("EXECUTE wake('{mids}'::bigint[])"));
            assert!(
                widest <= bound,
                "{round}: making {n} children ready processed {widest} rows in one node"
            );
            assert_eq!(
                count(&format!(
                    "SELECT count(*) FROM pgque.jobs WHERE queue = 'fan_ready_{tag}' AND state = 'ready'"
                )),
                n as i64 + 1
            );
            let (root, _) = fan(&format!("fan_cancel_{tag}"), n);
            let (widest, _) =
                explain_widest(&format!("EXECUTE prop(ARRAY[{root}]::bigint[], 'failed')"));
            assert!(
                widest <= bound,
                "{round}: cancelling {n} children processed {widest} rows in one node"
            );
            assert_eq!(
                count(&format!(
                    "SELECT count(*) FROM pgque.jobs WHERE queue = 'fan_cancel_{tag}' AND state = 'cancelled'"
                )),
                n as i64
            );
        }
    }
}
