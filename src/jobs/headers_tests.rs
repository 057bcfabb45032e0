//! In-server tests of job headers (trace context, docs/tracing.md): stored
//! beside args in pgque.jobs, returned by dispatch (every attempt) and
//! get_job, checked at enqueue; jobs without headers keep the job log.
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
        // a job with headers is in pgque.jobs; one without stays in the log
        assert_eq!(
            one::<String>(&format!("SELECT stored_in FROM pgque.get_job({with})")),
            Some("jobs".into())
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
        // a retry dispatches the same headers again (attempt 2)
        run(&format!(
            "SELECT pgque.fail({with}, {}, 'boom', now() - interval '1 second')",
            h.2
        ));
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
        // the whole batch took pgque.jobs (one statement), in input order
        assert_eq!(
            count("SELECT count(*) FROM pgque.all_jobs WHERE queue = 'hb' AND stored_in = 'jobs'"),
            3
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
