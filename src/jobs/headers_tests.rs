//! In-server tests of job headers (trace context, docs/tracing.md): stored
//! beside args in the job log (its batch rows' headers array) or in
//! pgque.jobs, returned by dispatch (every attempt, after every move from
//! the log to pgque.jobs) and get_job, checked at enqueue.
use pgrx::prelude::*;

#[pg_schema]
mod tests {
    use crate::jobs::tests::tests::{count, one, run, sqlstate};
    use pgrx::prelude::*;

    const TP: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    /// (job_id, headers as text) of one dispatch of `queue`, in order.
    fn dispatch_headers(queue: &str, limit: i32) -> Vec<(i64, Option<String>, i64)> {
        Spi::connect(|c| {
            c.select(
                &format!(
                    "SELECT job_id, headers::text, lease_token FROM pgque.dispatch(ARRAY['{queue}'], {limit}, 'w')"
                ),
                None,
                &[],
            )
            .unwrap()
            .map(|r| {
                (
                    r.get::<i64>(1).unwrap().unwrap(),
                    r.get::<String>(2).unwrap(),
                    r.get::<i64>(3).unwrap().unwrap(),
                )
            })
            .collect()
        })
    }

    #[pg_test]
    fn headers_ride_with_the_job_through_dispatch_retry_and_get_job() {
        run("SELECT pgque.create_job_queue('hq')");
        let with = one::<i64>(&format!(
            "SELECT pgque.enqueue('hq', 'k', '{{\"a\": 1}}', headers => '{{\"traceparent\": \"{TP}\", \"tracestate\": \"x=1\"}}')"
        ))
        .unwrap();
        let without = one::<i64>("SELECT pgque.enqueue('hq', 'k', '{}')").unwrap();
        // a job with headers stays in the log, as one without does
        assert_eq!(
            one::<String>(&format!("SELECT stored_in FROM pgque.get_job({with})")),
            Some("log".into())
        );
        assert_eq!(
            one::<String>(&format!("SELECT stored_in FROM pgque.get_job({without})")),
            Some("log".into())
        );
        assert_eq!(
            one::<String>(&format!(
                "SELECT headers ->> 'traceparent' FROM pgque.get_job({with})"
            )),
            Some(TP.into())
        );
        assert_eq!(
            one::<String>(&format!(
                "SELECT headers::text FROM pgque.get_job({without})"
            )),
            None
        );
        assert_eq!(
            one::<String>(&format!(
                "SELECT pgque.job_detail({with}) -> 'headers' ->> 'tracestate'"
            )),
            Some("x=1".into())
        );
        let got = dispatch_headers("hq", 10);
        assert_eq!(got.len(), 2);
        let h = got.iter().find(|r| r.0 == with).unwrap();
        assert!(h.1.as_deref().unwrap().contains(TP), "{got:?}");
        assert_eq!(got.iter().find(|r| r.0 == without).unwrap().1, None);
        // a retry dispatches the same headers again (attempt 2): the job
        // leaves its claim for pgque.jobs with them
        run(&format!(
            "SELECT pgque.fail({with}, {}, 'boom', now() - interval '1 second')",
            h.2
        ));
        assert_eq!(
            one::<String>(&format!("SELECT stored_in FROM pgque.get_job({with})")),
            Some("jobs".into())
        );
        let again = dispatch_headers("hq", 10);
        assert_eq!(again.len(), 1);
        assert_eq!(again[0].0, with);
        assert_eq!(again[0].1, h.1);
        assert_eq!(
            one::<i32>(&format!("SELECT attempt FROM pgque.get_job({with})")),
            Some(2)
        );
    }

    #[pg_test]
    fn a_batch_aligns_headers_with_its_jobs_keyed_or_not() {
        run("SELECT pgque.create_job_queue('hb')");
        // no unique keys: ENQUEUE_NO_KEYS_SQL_HEADERS
        let ids: Vec<i64> = Spi::connect(|c| {
            c.select(
                &format!(
                    "SELECT job_id FROM pgque.enqueue_ready_rows('hb', ARRAY['a', 'b', 'c'],
                         ARRAY['{{}}', '{{}}', '{{}}']::jsonb[],
                         headers => ARRAY[NULL, '{{\"traceparent\": \"{TP}\"}}', '{{}}']::jsonb[])
                     ORDER BY ord"
                ),
                None,
                &[],
            )
            .unwrap()
            .map(|r| r.get::<i64>(1).unwrap().unwrap())
            .collect()
        });
        assert_eq!(ids.len(), 3);
        let h = |id: i64| one::<String>(&format!("SELECT headers::text FROM pgque.get_job({id})"));
        assert_eq!(h(ids[0]), None);
        assert_eq!(h(ids[1]), Some(format!("{{\"traceparent\": \"{TP}\"}}")));
        assert_eq!(h(ids[2]), Some("{}".into()));
        // the whole batch is one row of the log, headers aligned
        assert_eq!(
            count("SELECT count(*) FROM pgque.all_jobs WHERE queue = 'hb' AND stored_in = 'log'"),
            3
        );
        assert_eq!(
            count(&format!(
                "SELECT count(*) FROM pgque.job_log WHERE id_lo <= {} AND id_hi >= {}
                   AND cardinality(headers) = 3 AND headers[1] IS NULL",
                ids[0], ids[2]
            )),
            1
        );
        // with a unique key: ENQUEUE_SQL_HEADERS, duplicates still reported
        let keyed: Vec<(i64, String)> = Spi::connect(|c| {
            c.select(
                "SELECT job_id, state FROM pgque.enqueue_ready_rows('hb', ARRAY['d', 'e'],
                     ARRAY['{}', '{}']::jsonb[], unique_keys => ARRAY['u', 'u'],
                     headers => ARRAY['{\"traceparent\": \"t1\"}', '{\"traceparent\": \"t2\"}']::jsonb[])
                 ORDER BY ord",
                None,
                &[],
            )
            .unwrap()
            .map(|r| (r.get::<i64>(1).unwrap().unwrap(), r.get::<String>(2).unwrap().unwrap()))
            .collect()
        });
        assert_eq!(keyed[0].1, "ready");
        assert_eq!(keyed[1], (keyed[0].0, "duplicate".into()));
        assert_eq!(h(keyed[0].0), Some("{\"traceparent\": \"t1\"}".into()));
        // a scheduled job keeps its headers when promoted
        let s = one::<i64>(
            "SELECT pgque.enqueue('hb', 'later', run_at => now() + interval '1 hour',
                                  headers => '{\"traceparent\": \"t3\"}')",
        )
        .unwrap();
        assert_eq!(h(s), Some("{\"traceparent\": \"t3\"}".into()));
        // an all-NULL headers array is no headers: the jobs stay in the log
        run(
            "SELECT count(*) FROM pgque.enqueue_ready_rows('hb', ARRAY['f'], ARRAY['{}']::jsonb[],
                 headers => ARRAY[NULL]::jsonb[])",
        );
        assert_eq!(
            count("SELECT count(*) FROM pgque.all_jobs WHERE queue = 'hb' AND kind = 'f' AND stored_in = 'log'"),
            1
        );
    }

    /// headers of every job of `queue` by id, as get_job and all_jobs give them
    /// (asserting both agree).
    fn headers_by_id(queue: &str) -> Vec<(i64, Option<String>, String)> {
        let rows: Vec<(i64, Option<String>, String)> = Spi::connect(|c| {
            c.select(
                &format!(
                    "SELECT a.id, a.headers::text, a.stored_in FROM pgque.all_jobs a
                     WHERE a.queue = '{queue}' ORDER BY a.id"
                ),
                None,
                &[],
            )
            .unwrap()
            .map(|r| {
                (
                    r.get::<i64>(1).unwrap().unwrap(),
                    r.get::<String>(2).unwrap(),
                    r.get::<String>(3).unwrap().unwrap(),
                )
            })
            .collect()
        });
        for (id, h, _) in &rows {
            assert_eq!(
                &one::<String>(&format!("SELECT headers::text FROM pgque.get_job({id})")),
                h,
                "get_job and all_jobs differ on job {id}"
            );
        }
        rows
    }

    #[pg_test]
    fn a_traced_batch_over_several_lanes_stays_in_the_log_and_dispatches_its_headers() {
        run("SELECT pgque.create_job_queue('hl')");
        // two priorities: two lanes, LOG_ENQUEUE_SQL's split rows
        let ids: Vec<i64> = Spi::connect(|c| {
            c.select(
                "SELECT job_id FROM pgque.enqueue_ready_rows('hl', ARRAY['a', 'b', 'c', 'd'],
                     ARRAY['{}', '{}', '{}', '{}']::jsonb[], priorities => ARRAY[0, 5, 0, 5]::int2[],
                     headers => ARRAY['{\"traceparent\": \"h1\"}', NULL,
                                      '{\"traceparent\": \"h3\"}', '{\"traceparent\": \"h4\"}']::jsonb[])
                 ORDER BY ord",
                None,
                &[],
            )
            .unwrap()
            .map(|r| r.get::<i64>(1).unwrap().unwrap())
            .collect()
        });
        let want = |i: usize| match i {
            1 => None,
            _ => Some(format!("{{\"traceparent\": \"h{}\"}}", i + 1)),
        };
        let got = headers_by_id("hl");
        assert_eq!(got.len(), 4);
        for (i, id) in ids.iter().enumerate() {
            let g = got.iter().find(|r| r.0 == *id).unwrap();
            assert_eq!((g.1.clone(), g.2.as_str()), (want(i), "log"), "job {i}");
        }
        // LOG_DISPATCH_SQL (two lanes): each job with its own headers
        let d = dispatch_headers("hl", 10);
        assert_eq!(d.len(), 4);
        for (i, id) in ids.iter().enumerate() {
            assert_eq!(d.iter().find(|r| r.0 == *id).unwrap().1, want(i), "job {i}");
        }
        // running jobs still show them
        assert_eq!(
            headers_by_id("hl").iter().filter(|r| r.1.is_some()).count(),
            3
        );
    }

    #[pg_test]
    fn headers_survive_every_move_from_the_log_to_pgque_jobs() {
        run("SELECT pgque.create_job_queue('hm')");
        let h = |n: i32| format!("{{\"traceparent\": \"m{n}\"}}");
        // a ready job of pgque.jobs (a unique key) ahead of the log's jobs
        let keyed = one::<i64>(
            "SELECT pgque.enqueue('hm', 'k', unique_key => 'u', headers => '{\"traceparent\": \"mk\"}')",
        )
        .unwrap();
        let ids: Vec<i64> = (1..=4)
            .map(|n| {
                one::<i64>(&format!(
                    "SELECT pgque.enqueue('hm', 'k', headers => '{}')",
                    h(n)
                ))
                .unwrap()
            })
            .collect();
        // cancel of a ready log job: READY_TO_SIDE_SQL
        run(&format!("SELECT pgque.cancel({})", ids[3]));
        assert_eq!(
            one::<String>(&format!(
                "SELECT stored_in || ' ' || state || ' ' || (headers ->> 'traceparent') FROM pgque.get_job({})",
                ids[3]
            )),
            Some("jobs cancelled m4".into())
        );
        // the dispatch must rank the log against pgque.jobs: it spills the
        // log's first job (LOG_SPILL_SQL) and dispatches both from pgque.jobs
        let d = dispatch_headers("hm", 2);
        assert_eq!(
            d.iter().map(|r| (r.0, r.1.clone())).collect::<Vec<_>>(),
            vec![
                (keyed, Some("{\"traceparent\": \"mk\"}".into())),
                (ids[0], Some(h(1)))
            ]
        );
        assert_eq!(
            one::<String>(&format!("SELECT stored_in FROM pgque.get_job({})", ids[0])),
            Some("jobs".into())
        );
        let rest = dispatch_headers("hm", 10);
        assert_eq!(
            rest.iter().map(|r| (r.0, r.1.clone())).collect::<Vec<_>>(),
            vec![(ids[1], Some(h(2))), (ids[2], Some(h(3)))]
        );
        // snooze of a running log job (TO_SIDE_SQL) keeps them for the next run
        run("SELECT pgque.create_job_queue('hn')");
        let j = one::<i64>(&format!(
            "SELECT pgque.enqueue('hn', 'k', headers => '{}')",
            h(9)
        ))
        .unwrap();
        let first = dispatch_headers("hn", 1);
        assert_eq!(first[0].1, Some(h(9)));
        run(&format!("SELECT pgque.snooze({j}, {}, now())", first[0].2));
        assert_eq!(
            one::<String>(&format!(
                "SELECT stored_in || ' ' || headers::text FROM pgque.get_job({j})"
            )),
            Some(format!("jobs {}", h(9)))
        );
        assert_eq!(dispatch_headers("hn", 1)[0].1, Some(h(9)));
    }

    #[pg_test]
    fn flows_and_depends_on_jobs_carry_headers() {
        run("SELECT pgque.create_job_queue('hf')");
        let ids: Vec<(String, i64)> = Spi::connect(|c| {
            c.select(
                "SELECT key, job_id FROM pgque.enqueue_flow('hf', '[
                     {\"key\": \"a\", \"kind\": \"k\", \"headers\": {\"traceparent\": \"fa\"}},
                     {\"key\": \"b\", \"kind\": \"k\", \"depends_on\": [\"a\"],
                      \"headers\": {\"traceparent\": \"fb\", \"tracestate\": \"s=1\"}},
                     {\"key\": \"c\", \"kind\": \"k\", \"depends_on\": [\"a\"]}]')",
                None,
                &[],
            )
            .unwrap()
            .map(|r| {
                (
                    r.get::<String>(1).unwrap().unwrap(),
                    r.get::<i64>(2).unwrap().unwrap(),
                )
            })
            .collect()
        });
        let id = |k: &str| ids.iter().find(|r| r.0 == k).unwrap().1;
        let h = |id: i64| one::<String>(&format!("SELECT headers::text FROM pgque.get_job({id})"));
        assert_eq!(h(id("a")), Some("{\"traceparent\": \"fa\"}".into()));
        assert_eq!(h(id("c")), None);
        // a job behind an existing one, with headers
        let d = one::<i64>(&format!(
            "SELECT pgque.enqueue('hf', 'k', depends_on => ARRAY[{}]::bigint[],
                                  headers => '{{\"traceparent\": \"fd\"}}')",
            id("a")
        ))
        .unwrap();
        assert_eq!(h(d), Some("{\"traceparent\": \"fd\"}".into()));
        // the late link of d is the worker's duty; run it here
        run("SELECT pgque.job_maint()");
        // a completes: its children become ready and dispatch with their headers
        let first = dispatch_headers("hf", 10);
        assert_eq!(first.len(), 1);
        assert_eq!(first[0].1, Some("{\"traceparent\": \"fa\"}".into()));
        run(&format!(
            "SELECT pgque.complete({}, {})",
            first[0].0, first[0].2
        ));
        let next = dispatch_headers("hf", 10);
        let got = |id: i64| next.iter().find(|r| r.0 == id).map(|r| r.1.clone());
        assert_eq!(
            got(id("b")),
            // jsonb orders keys by length
            Some(Some(
                "{\"tracestate\": \"s=1\", \"traceparent\": \"fb\"}".into()
            ))
        );
        assert_eq!(got(id("c")), Some(None));
        assert_eq!(
            got(d),
            Some(Some("{\"traceparent\": \"fd\"}".into())),
            "{next:?}"
        );
    }

    #[pg_test]
    fn bad_headers_are_refused_and_change_nothing() {
        run("SELECT pgque.create_job_queue('hx')");
        let before = count("SELECT count(*) FROM pgque.all_jobs WHERE queue = 'hx'");
        assert_eq!(
            sqlstate("SELECT pgque.enqueue('hx', 'k', headers => '[1]')"),
            "22023"
        );
        assert_eq!(
            sqlstate("SELECT pgque.enqueue('hx', 'k', headers => '{\"a\": {\"b\": \"c\"}}')"),
            "22023"
        );
        assert_eq!(
            sqlstate("SELECT pgque.enqueue('hx', 'k', headers => jsonb_build_object('tracestate', repeat('x', 1020)))"),
            "54000"
        );
        // at the cap exactly: accepted (compact JSON {"t":"..."} is 8 bytes around the value)
        run("SELECT pgque.enqueue('hx', 'k', headers => jsonb_build_object('t', repeat('x', 1016)))");
        assert_eq!(
            sqlstate("SELECT pgque.enqueue('hx', 'k', headers => jsonb_build_object('t', repeat('x', 1017)))"),
            "54000"
        );
        assert_eq!(
            sqlstate("SELECT * FROM pgque.enqueue_ready_rows('hx', ARRAY['k'], ARRAY['{}']::jsonb[], headers => ARRAY['{}', '{}']::jsonb[])"),
            "22023"
        );
        assert_eq!(
            count("SELECT count(*) FROM pgque.all_jobs WHERE queue = 'hx'"),
            before + 1
        );
    }
}
