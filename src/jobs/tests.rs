//! In-server tests of the job store (each runs in a transaction that is
//! rolled back). Multi-session behaviour (concurrent producers, NOTIFY at
//! commit, concurrent dispatchers) is tested in pg_test/tests/jobs_*.rs.
use pgrx::prelude::*;

#[pg_schema]
mod tests {
    use pgrx::prelude::*;

    pub fn run(sql: &str) {
        Spi::run(sql).unwrap_or_else(|e| panic!("{sql}: {e}"));
    }

    pub fn one<T: pgrx::FromDatum + pgrx::IntoDatum>(sql: &str) -> Option<T> {
        Spi::get_one::<T>(sql).unwrap_or_else(|e| panic!("{sql}: {e}"))
    }

    pub fn count(sql: &str) -> i64 {
        one::<i64>(sql).unwrap_or(0)
    }

    /// SQLSTATE raised by `sql` (run in a subtransaction, so its effects are
    /// rolled back), or "ok".
    pub fn sqlstate(sql: &str) -> String {
        let missing = one::<bool>(
            "SELECT NOT EXISTS (SELECT 1 FROM pg_proc
                                WHERE proname = 'sqlstate_of' AND pronamespace = pg_my_temp_schema())",
        );
        if missing == Some(true) {
            run("CREATE FUNCTION pg_temp.sqlstate_of(q text) RETURNS text
                 LANGUAGE plpgsql AS $$
                 BEGIN EXECUTE q; RETURN 'ok';
                 EXCEPTION WHEN OTHERS THEN RETURN SQLSTATE; END $$");
        }
        Spi::get_one_with_args::<String>("SELECT pg_temp.sqlstate_of($1)", &[sql.into()])
            .unwrap()
            .unwrap()
    }

    fn jobs_in(queue: &str) -> i64 {
        count(&format!(
            "SELECT count(*) FROM pgque.jobs WHERE queue = '{queue}'"
        ))
    }

    #[pg_test]
    fn create_and_config_job_queue() {
        assert_eq!(one::<i32>("SELECT pgque.create_job_queue('q1')"), Some(1));
        assert_eq!(one::<i32>("SELECT pgque.create_job_queue('q1')"), Some(0));
        assert_eq!(
            one::<i32>("SELECT pgque.create_job_queue('q2', 'round_robin', 4)"),
            Some(1)
        );
        assert_eq!(
            one::<String>(
                "SELECT mode || '/' || shards FROM pgque.job_queues WHERE queue_name = 'q2'"
            ),
            Some("round_robin/4".into())
        );
        run("SELECT pgque.set_job_queue_config('q1', 'max_attempts', '3')");
        run("SELECT pgque.set_job_queue_config('q1', 'lease', '90 seconds')");
        run("SELECT pgque.set_job_queue_config('q1', 'mode', 'round_robin')");
        run("SELECT pgque.pause_job_queue('q1')");
        assert_eq!(
            one::<String>(
                "SELECT max_attempts || '/' || extract(epoch FROM lease)::int || '/' || mode || '/' || paused
                 FROM pgque.job_queues WHERE queue_name = 'q1'"
            ),
            Some("3/90/round_robin/true".into())
        );
        run("SELECT pgque.resume_job_queue('q1')");
        run("SELECT pgque.set_job_queue_config('q1', 'max_attempts', NULL)");
        assert_eq!(
            one::<String>("SELECT max_attempts || '/' || paused FROM pgque.job_queues WHERE queue_name = 'q1'"),
            Some("25/false".into())
        );
        // Bad input: specific SQLSTATEs, nothing changed.
        assert_eq!(sqlstate("SELECT pgque.create_job_queue(NULL)"), "22004");
        assert_eq!(sqlstate("SELECT pgque.create_job_queue('')"), "42602");
        assert_eq!(sqlstate("SELECT pgque.create_job_queue('a b')"), "42602");
        assert_eq!(
            sqlstate(&format!(
                "SELECT pgque.create_job_queue('{}')",
                "x".repeat(53)
            )),
            "42622"
        );
        assert_eq!(
            sqlstate("SELECT pgque.create_job_queue('q3', 'lifo')"),
            "22023"
        );
        assert_eq!(
            sqlstate("SELECT pgque.create_job_queue('q3', 'strict_fifo', 0)"),
            "22003"
        );
        assert_eq!(
            sqlstate("SELECT pgque.create_job_queue('q3', 'strict_fifo', 65)"),
            "22003"
        );
        assert_eq!(
            sqlstate("SELECT pgque.set_job_queue_config('nope', 'paused', 'true')"),
            "42704"
        );
        assert_eq!(
            sqlstate("SELECT pgque.set_job_queue_config('q1', 'color', 'red')"),
            "22023"
        );
        assert_eq!(
            sqlstate("SELECT pgque.set_job_queue_config('q1', 'max_attempts', '0')"),
            "22003"
        );
        assert_eq!(
            sqlstate("SELECT pgque.set_job_queue_config('q1', 'max_attempts', 'x')"),
            "22023"
        );
        assert_eq!(
            sqlstate("SELECT pgque.set_job_queue_config('q1', 'lease', '-1 second')"),
            "22023"
        );
        assert_eq!(
            sqlstate("SELECT pgque.set_job_queue_config('q1', 'lease', 'soon')"),
            "22007"
        );
        assert_eq!(
            sqlstate("SELECT pgque.set_job_queue_config('q1', 'paused', 'maybe')"),
            "22023"
        );
        assert_eq!(sqlstate("SELECT pgque.pause_job_queue('nope')"), "42704");
        assert_eq!(count("SELECT count(*) FROM pgque.job_queues"), 2);
        assert_eq!(
            one::<String>("SELECT max_attempts || '/' || paused FROM pgque.job_queues WHERE queue_name = 'q1'"),
            Some("25/false".into())
        );
    }

    #[pg_test]
    fn drop_job_queue_refuses_unfinished_jobs_unless_forced() {
        run("SELECT pgque.create_job_queue('d')");
        run("SELECT pgque.enqueue('d', 'k', '{}', actor => 'a1')");
        assert_eq!(sqlstate("SELECT pgque.drop_job_queue('d')"), "55000");
        assert_eq!(sqlstate("SELECT pgque.drop_job_queue('nope')"), "42704");
        assert_eq!(jobs_in("d"), 1);
        assert_eq!(
            one::<bool>("SELECT pgque.drop_job_queue('d', force => true)"),
            Some(true)
        );
        assert_eq!(jobs_in("d"), 0);
        assert_eq!(
            count("SELECT count(*) FROM pgque.job_queues WHERE queue_name = 'd'"),
            0
        );
    }

    #[pg_test]
    fn enqueue_ready_rows_returns_ids_in_input_order() {
        run("SELECT pgque.create_job_queue('io')");
        let rows = Spi::connect(|c| {
            c.select(
                "SELECT ord, job_id, state FROM pgque.enqueue_ready_rows('io',
                     ARRAY['a','b','c','d','e'],
                     ARRAY['{\"n\":1}','{\"n\":2}','{\"n\":3}','{\"n\":4}','{\"n\":5}']::jsonb[])",
                None,
                &[],
            )
            .unwrap()
            .map(|r| {
                (
                    r.get::<i32>(1).unwrap().unwrap(),
                    r.get::<i64>(2).unwrap().unwrap(),
                    r.get::<String>(3).unwrap().unwrap(),
                )
            })
            .collect::<Vec<_>>()
        });
        assert_eq!(rows.len(), 5);
        for (i, (ord, _, state)) in rows.iter().enumerate() {
            assert_eq!(*ord as usize, i + 1);
            assert_eq!(state, "ready");
        }
        // ids ascend with input position, and each id holds its own input.
        assert!(rows.windows(2).all(|w| w[0].1 < w[1].1));
        for (ord, id, _) in &rows {
            let kind_n = one::<String>(&format!(
                "SELECT kind || (args->>'n') FROM pgque.jobs WHERE id = {id}"
            ));
            let expect = format!("{}{}", ["a", "b", "c", "d", "e"][*ord as usize - 1], ord);
            assert_eq!(kind_n, Some(expect));
        }
        // ready jobs: ready_seq = id (their FIFO position), one 'enqueued' event each.
        assert_eq!(
            count("SELECT count(*) FROM pgque.jobs WHERE queue = 'io' AND ready_seq = id AND state = 'ready'"),
            5
        );
        assert_eq!(
            count(
                "SELECT count(*) FROM pgque.job_events WHERE queue = 'io' AND event = 'enqueued'"
            ),
            5
        );
        // defaults: priority 0, the queue's max_attempts, attempt 0.
        assert_eq!(
            count("SELECT count(*) FROM pgque.jobs WHERE queue = 'io' AND priority = 0 AND max_attempts = 25 AND attempt = 0"),
            5
        );
        // An empty batch is fine and returns nothing.
        assert_eq!(
            count(
                "SELECT count(*) FROM pgque.enqueue_ready_rows('io', '{}'::text[], '{}'::jsonb[])"
            ),
            0
        );
    }

    #[pg_test]
    fn enqueue_all_columns_and_single_enqueue() {
        run("SELECT pgque.create_job_queue('all')");
        run(
            "SELECT * FROM pgque.enqueue_ready_rows('all', ARRAY['k1','k2'],
                 ARRAY['{}','[1,2]']::jsonb[],
                 priorities => ARRAY[5, NULL]::smallint[],
                 run_at => ARRAY[NULL, now() - interval '1 hour']::timestamptz[],
                 actors => ARRAY['acme', NULL],
                 fairness_keys => ARRAY['f1', 'f2'],
                 identity_keys => ARRAY[NULL, 'i2'],
                 unique_keys => ARRAY['u1', NULL],
                 max_attempts => ARRAY[3, NULL])",
        );
        assert_eq!(
            one::<String>(
                "SELECT string_agg(concat_ws('|', kind, args::text, priority, max_attempts, actor, fairness_key,
                                             identity_key, unique_key, state), ';' ORDER BY id)
                 FROM pgque.jobs WHERE queue = 'all'"
            ),
            Some("k1|{}|5|3|acme|f1|u1|ready;k2|[1, 2]|0|25|f2|i2|ready".into())
        );
        // the actor got its counter row
        assert_eq!(
            count("SELECT count(*) FROM pgque.job_actors WHERE actor = 'acme' AND running = 0"),
            1
        );
        let id = one::<i64>(
            "SELECT pgque.enqueue('all', 'one', '{\"x\":1}', priority => 2, unique_key => 'solo')",
        )
        .unwrap();
        assert_eq!(
            one::<String>(&format!(
                "SELECT kind || args::text || priority || state FROM pgque.jobs WHERE id = {id}"
            )),
            Some("one{\"x\": 1}2ready".into())
        );
        // a duplicate returns the live job's id
        assert_eq!(
            one::<i64>("SELECT pgque.enqueue('all', 'one', '{}', unique_key => 'solo')"),
            Some(id)
        );
        assert_eq!(
            sqlstate("SELECT pgque.enqueue('all', 'one', '{}', unique_key => 'solo', on_duplicate => 'error')"),
            "23505"
        );
        assert_eq!(jobs_in("all"), 3);
    }

    #[pg_test]
    fn unequal_arrays_are_rejected_and_nothing_is_inserted() {
        run("SELECT pgque.create_job_queue('ua')");
        for sql in [
            "SELECT * FROM pgque.enqueue_ready_rows('ua', ARRAY['a','b'], ARRAY['{}']::jsonb[])",
            "SELECT * FROM pgque.enqueue_ready_rows('ua', ARRAY['a'], ARRAY['{}','{}']::jsonb[])",
            "SELECT * FROM pgque.enqueue_ready_rows('ua', ARRAY['a','b'], ARRAY['{}','{}']::jsonb[], priorities => ARRAY[1]::smallint[])",
            "SELECT * FROM pgque.enqueue_ready_rows('ua', ARRAY['a','b'], ARRAY['{}','{}']::jsonb[], run_at => ARRAY[now()])",
            "SELECT * FROM pgque.enqueue_ready_rows('ua', ARRAY['a','b'], ARRAY['{}','{}']::jsonb[], actors => ARRAY['x','y','z'])",
            "SELECT * FROM pgque.enqueue_ready_rows('ua', ARRAY['a','b'], ARRAY['{}','{}']::jsonb[], fairness_keys => ARRAY['x'])",
            "SELECT * FROM pgque.enqueue_ready_rows('ua', ARRAY['a','b'], ARRAY['{}','{}']::jsonb[], identity_keys => '{}'::text[])",
            "SELECT * FROM pgque.enqueue_ready_rows('ua', ARRAY['a','b'], ARRAY['{}','{}']::jsonb[], unique_keys => ARRAY['x'])",
            "SELECT * FROM pgque.enqueue_ready_rows('ua', ARRAY['a','b'], ARRAY['{}','{}']::jsonb[], max_attempts => ARRAY[1,2,3])",
        ] {
            assert_eq!(sqlstate(sql), "22023", "{sql}");
        }
        assert_eq!(jobs_in("ua"), 0);
    }

    #[pg_test]
    fn bad_input_gets_specific_sqlstates_and_changes_nothing() {
        run("SELECT pgque.create_job_queue('bad')");
        let cases = [
            ("SELECT * FROM pgque.enqueue_ready_rows('nope', ARRAY['a'], ARRAY['{}']::jsonb[])", "42704"),
            ("SELECT pgque.enqueue('nope', 'a')", "42704"),
            ("SELECT * FROM pgque.enqueue_ready_rows(NULL, ARRAY['a'], ARRAY['{}']::jsonb[])", "22004"),
            ("SELECT * FROM pgque.enqueue_ready_rows('bad', NULL, ARRAY['{}']::jsonb[])", "22004"),
            ("SELECT * FROM pgque.enqueue_ready_rows('bad', ARRAY['a'], NULL)", "22004"),
            ("SELECT * FROM pgque.enqueue_ready_rows('bad', ARRAY['a', NULL], ARRAY['{}','{}']::jsonb[])", "22004"),
            ("SELECT * FROM pgque.enqueue_ready_rows('bad', ARRAY['a', ''], ARRAY['{}','{}']::jsonb[])", "22023"),
            ("SELECT * FROM pgque.enqueue_ready_rows('bad', ARRAY['a', 'b'], ARRAY['{}', NULL]::jsonb[])", "22004"),
            ("SELECT pgque.enqueue('bad', NULL)", "22004"),
            ("SELECT pgque.enqueue('bad', 'a', NULL)", "22004"),
            ("SELECT pgque.enqueue('bad', 'a', 'not json')", "22P02"),
            ("SELECT * FROM pgque.enqueue_ready_rows('bad', ARRAY['a'], ARRAY['{}']::jsonb[], priorities => ARRAY[1001]::smallint[])", "22003"),
            ("SELECT pgque.enqueue('bad', 'a', priority => -1001)", "22003"),
            ("SELECT * FROM pgque.enqueue_ready_rows('bad', ARRAY['a'], ARRAY['{}']::jsonb[], max_attempts => ARRAY[0])", "22003"),
            ("SELECT * FROM pgque.enqueue_ready_rows('bad', ARRAY['a'], ARRAY['{}']::jsonb[], run_at => ARRAY['infinity']::timestamptz[])", "22023"),
            ("SELECT * FROM pgque.enqueue_ready_rows('bad', ARRAY['a'], ARRAY['{}']::jsonb[], on_duplicate => 'replace')", "22023"),
            ("SELECT * FROM pgque.enqueue_ready_rows('bad', ARRAY['a'], ARRAY['{}']::jsonb[], on_duplicate => NULL)", "22004"),
            ("SELECT * FROM pgque.enqueue_ready_rows('b c', ARRAY['a'], ARRAY['{}']::jsonb[])", "42602"),
        ];
        for (sql, code) in cases {
            assert_eq!(sqlstate(sql), code, "{sql}");
        }
        assert_eq!(count("SELECT count(*) FROM pgque.jobs"), 0);
        assert_eq!(count("SELECT count(*) FROM pgque.job_events"), 0);
    }

    #[pg_test]
    fn duplicates_skip_or_error_and_duplicates_inside_one_batch() {
        run("SELECT pgque.create_job_queue('dup')");
        let first =
            one::<i64>("SELECT pgque.enqueue('dup', 'k', '{}', unique_key => 'u1')").unwrap();
        // skip mode: the existing key and an in-batch repeat are reported, the rest goes in.
        let rows = Spi::connect(|c| {
            c.select(
                "SELECT ord, job_id, state FROM pgque.enqueue_ready_rows('dup',
                     ARRAY['a','b','c','d'], ARRAY['{}','{}','{}','{}']::jsonb[],
                     unique_keys => ARRAY['u1', 'u2', 'u2', NULL])",
                None,
                &[],
            )
            .unwrap()
            .map(|r| {
                (
                    r.get::<i32>(1).unwrap().unwrap(),
                    r.get::<i64>(2).unwrap(),
                    r.get::<String>(3).unwrap().unwrap(),
                )
            })
            .collect::<Vec<_>>()
        });
        assert_eq!(rows[0], (1, Some(first), "duplicate".to_string()));
        assert_eq!(rows[1].2, "ready");
        assert_eq!(rows[2], (3, rows[1].1, "duplicate".to_string()));
        assert_eq!(rows[3].2, "ready");
        assert_eq!(jobs_in("dup"), 3);
        // error mode: 23505 and nothing of the batch persists.
        assert_eq!(
            sqlstate("SELECT * FROM pgque.enqueue_ready_rows('dup', ARRAY['x','y'], ARRAY['{}','{}']::jsonb[],
                          unique_keys => ARRAY['u9', 'u1'], on_duplicate => 'error')"),
            "23505"
        );
        assert_eq!(
            sqlstate("SELECT * FROM pgque.enqueue_ready_rows('dup', ARRAY['x','y'], ARRAY['{}','{}']::jsonb[],
                          unique_keys => ARRAY['u8', 'u8'], on_duplicate => 'error')"),
            "23505"
        );
        assert_eq!(jobs_in("dup"), 3);
        // error mode without duplicates works.
        assert_eq!(
            count("SELECT count(*) FROM pgque.enqueue_ready_rows('dup', ARRAY['x'], ARRAY['{}']::jsonb[],
                       unique_keys => ARRAY['u7'], on_duplicate => 'error') WHERE state = 'ready'"),
            1
        );
        // A key is free again once its job is terminal.
        run(&format!(
            "UPDATE pgque.jobs SET state = 'completed', ready_seq = NULL, finished_at = now() WHERE id = {first}"
        ));
        let again =
            one::<i64>("SELECT pgque.enqueue('dup', 'k', '{}', unique_key => 'u1')").unwrap();
        assert_ne!(again, first);
        // Keys are per queue.
        run("SELECT pgque.create_job_queue('dup2')");
        assert_ne!(
            one::<i64>("SELECT pgque.enqueue('dup2', 'k', '{}', unique_key => 'u1')"),
            Some(again)
        );
    }

    #[pg_test]
    fn future_run_at_goes_to_the_scheduled_set() {
        run("SELECT pgque.create_job_queue('sch')");
        let states = one::<String>(
            "SELECT string_agg(state, ',' ORDER BY ord) FROM pgque.enqueue_ready_rows('sch',
                 ARRAY['a','b','c'], ARRAY['{}','{}','{}']::jsonb[],
                 run_at => ARRAY[now() + interval '1 hour', NULL, now() - interval '1 minute'])",
        );
        assert_eq!(states, Some("scheduled,ready,ready".into()));
        assert_eq!(
            count(
                "SELECT count(*) FROM pgque.jobs WHERE queue = 'sch' AND state = 'scheduled'
                   AND ready_seq IS NULL AND run_at > now()"
            ),
            1
        );
        assert_eq!(
            count(
                "SELECT count(*) FROM pgque.job_events WHERE queue = 'sch' AND event = 'scheduled'"
            ),
            1
        );
    }

    #[pg_test]
    fn lanes_are_locked_to_commit_and_fifo_within_a_lane() {
        run("SELECT pgque.create_job_queue('ln')");
        run(
            "SELECT * FROM pgque.enqueue_ready_rows('ln', ARRAY['a','b','c','d'],
                 ARRAY['{}','{}','{}','{}']::jsonb[], priorities => ARRAY[1,2,1,2]::smallint[])",
        );
        // two lanes touched -> two lane locks held by this transaction until it ends,
        // plus the queue's shared lock.
        assert_eq!(
            count("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid()
                   AND classid::bigint = 1785684588 AND mode = 'ExclusiveLock' AND granted"),
            2
        );
        assert_eq!(
            count("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid()
                   AND classid::bigint = 1785684593 AND mode = 'ShareLock' AND granted"),
            1
        );
        // within each lane ready_seq follows input order
        assert_eq!(
            one::<String>("SELECT string_agg(kind, '' ORDER BY priority, ready_seq) FROM pgque.jobs WHERE queue = 'ln'"),
            Some("acbd".into())
        );
        // a sharded queue spreads producers over lanes by session
        run("SELECT pgque.create_job_queue('ln4', 'strict_fifo', 4)");
        run("SELECT pgque.enqueue('ln4', 'x')");
        assert_eq!(
            count("SELECT count(*) FROM pgque.jobs WHERE queue = 'ln4' AND shard = pg_backend_pid() % 4"),
            1
        );
    }

    #[pg_test]
    fn job_queue_status_counts_by_state() {
        run("SELECT pgque.create_job_queue('st')");
        run("SELECT * FROM pgque.enqueue_ready_rows('st', ARRAY['a','b','c'], ARRAY['{}','{}','{}']::jsonb[],
                 priorities => ARRAY[0,1,0]::smallint[],
                 run_at => ARRAY[NULL, NULL, now() + interval '1 day'])");
        assert_eq!(
            one::<String>(
                "SELECT concat_ws(',', scheduled, ready, running, completed, failed, cancelled, lanes,
                                  oldest_ready_age >= interval '0')
                 FROM pgque.job_queue_status WHERE queue_name = 'st'"
            ),
            Some("1,2,0,0,0,0,2,t".into())
        );
    }

    #[pg_test]
    fn roles_writer_enqueues_but_does_not_administer() {
        run("SELECT pgque.create_job_queue('rq')");
        assert_eq!(sqlstate("SELECT 1"), "ok"); // creates the helper as superuser
        run("SET LOCAL ROLE pgque_writer");
        assert_eq!(sqlstate("SELECT pgque.enqueue('rq', 'k')"), "ok");
        assert_eq!(
            sqlstate(
                "SELECT * FROM pgque.enqueue_ready_rows('rq', ARRAY['k'], ARRAY['{}']::jsonb[])"
            ),
            "ok"
        );
        assert_eq!(sqlstate("SELECT pgque.create_job_queue('rq2')"), "42501");
        assert_eq!(sqlstate("SELECT pgque.drop_job_queue('rq', true)"), "42501");
        assert_eq!(sqlstate("SELECT pgque.set_actor_capacity('a', 1)"), "42501");
        assert_eq!(sqlstate("SELECT pgque.pause_job_queue('rq')"), "42501");
        assert_eq!(sqlstate("SELECT count(*) FROM pgque.jobs"), "42501");
        assert_eq!(sqlstate("INSERT INTO pgque.jobs (id) VALUES (1)"), "42501");
        run("RESET ROLE");
        run("SET LOCAL ROLE pgque_reader");
        assert_eq!(sqlstate("SELECT pgque.enqueue('rq', 'k')"), "42501");
        assert_eq!(
            sqlstate("SELECT count(*) FROM pgque.job_queue_status"),
            "ok"
        );
        run("RESET ROLE");
        run("SET LOCAL ROLE pgque_admin");
        assert_eq!(sqlstate("SELECT pgque.create_job_queue('rq2')"), "ok");
        assert_eq!(sqlstate("SELECT pgque.enqueue('rq2', 'k')"), "ok");
        run("RESET ROLE");
        assert_eq!(jobs_in("rq"), 2);
    }

    #[pg_test]
    fn actor_capacity_is_set_and_validated() {
        run("SELECT pgque.set_actor_capacity('acme', 3)");
        run("SELECT pgque.set_actor_capacity('acme', 5)");
        assert_eq!(
            one::<i32>("SELECT max_concurrent FROM pgque.job_actors WHERE actor = 'acme'"),
            Some(5)
        );
        run("SELECT pgque.set_actor_capacity('acme', NULL)");
        assert_eq!(
            count("SELECT count(*) FROM pgque.job_actors WHERE actor = 'acme' AND max_concurrent IS NULL"),
            1
        );
        assert_eq!(
            sqlstate("SELECT pgque.set_actor_capacity(NULL, 1)"),
            "22004"
        );
        assert_eq!(sqlstate("SELECT pgque.set_actor_capacity('', 1)"), "42602");
        assert_eq!(
            sqlstate("SELECT pgque.set_actor_capacity('x', -1)"),
            "22003"
        );
    }
}
