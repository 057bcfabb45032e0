//! The PgQue-compatible SQL API of event queues (DESIGN.md section 1).
//!
//! Every function is SECURITY DEFINER with a pinned search_path, except the
//! send path (send, send_batch, insert_event), which switches to the owner
//! itself and qualifies every name (owner.rs says why): roles get EXECUTE on
//! functions (sql/99_finalize.sql), never rights on the tables.
//! The bodies are thin: argument checks, then the engine in `crate::log`.
//!
//! `send` sends, `consume` subscribes, receives, acks and retries, `pgq`
//! holds PgQ's batch primitives; the other modules one concern each.

pub mod admin;
pub mod consume;
pub mod dead_letter;
pub mod delayed;
pub mod idem;
pub mod info;
pub mod members;
pub mod observe;
pub mod owner;
pub mod pgq;
pub mod pgq_compat;
pub mod resize;
pub mod send;
pub mod settings;
pub mod slots;
pub mod srf;
pub mod stored;
pub mod triggers;

pub(crate) use consume::{deliver, max_return_arg};

#[cfg(any(test, feature = "pg_test"))]
#[pgrx::pg_schema]
mod tests {
    use pgrx::prelude::*;

    fn one_i64(sql: &str) -> Option<i64> {
        Spi::get_one::<i64>(sql).unwrap()
    }
    fn one_i32(sql: &str) -> Option<i32> {
        Spi::get_one::<i32>(sql).unwrap()
    }

    /// Each id send_batch returns is the event of the payload at the same
    /// position (jsonb, text and keyed variants; NULL elements and a 2-D array
    /// are taken in storage order, as unnest gives them).
    #[pg_test]
    fn send_batch_ids_align_with_the_payloads() {
        Spi::run("SELECT pgque.create_queue('al')").unwrap();
        let qid = one_i32("SELECT queue_id FROM pgque.queue WHERE queue_name = 'al'").unwrap();
        let read = format!("SELECT ev_data, ev_extra1 FROM pgque.event_{qid} WHERE ev_id = $1");
        let cases = [
            ("SELECT pgque.send_batch('al', ARRAY['{\"n\": 1}', NULL, '{\"n\": 3}']::jsonb[])",
             vec![Some("{\"n\": 1}"), None, Some("{\"n\": 3}")], vec![None, None, None]),
            ("SELECT pgque.send_batch('al', 't', ARRAY[['a', 'b'], ['c', NULL]]::text[])",
             vec![Some("a"), Some("b"), Some("c"), None], vec![None, None, None, None]),
            ("SELECT pgque.send_batch('al', 't', ARRAY['x', 'y', 'z']::text[], ARRAY['k1', NULL, 'k3'])",
             vec![Some("x"), Some("y"), Some("z")], vec![Some("k1"), None, Some("k3")]),
            ("SELECT pgque.send_batch('al', 't', ARRAY['[1]', '\"s\"']::jsonb[], ARRAY['j1', 'j2'])",
             vec![Some("[1]"), Some("\"s\"")], vec![Some("j1"), Some("j2")]),
        ];
        for (sql, payloads, keys) in cases {
            let ids = Spi::get_one::<Vec<i64>>(sql).unwrap().unwrap();
            assert_eq!(ids.len(), payloads.len(), "{sql}");
            assert!(ids.windows(2).all(|w| w[0] < w[1]), "{sql}: {ids:?}");
            for (i, id) in ids.iter().enumerate() {
                let row = Spi::get_two_with_args::<String, String>(&read, &[(*id).into()]).unwrap();
                assert_eq!(row.0.as_deref(), payloads[i], "{sql}: position {i}");
                assert_eq!(row.1.as_deref(), keys[i], "{sql}: position {i}");
            }
        }
    }

    #[pg_test]
    fn create_subscribe_and_send_in_one_transaction() {
        assert_eq!(one_i32("SELECT pgque.create_queue('t1')"), Some(1));
        assert_eq!(one_i32("SELECT pgque.create_queue('t1')"), Some(0));
        assert_eq!(one_i32("SELECT pgque.subscribe('t1', 'c')"), Some(1));
        assert_eq!(one_i32("SELECT pgque.subscribe('t1', 'c')"), Some(0));
        let a = one_i64("SELECT pgque.send('t1', 'x'::text)").unwrap();
        let b = one_i64("SELECT pgque.send('t1', '{\"k\": 1}'::jsonb)").unwrap();
        assert_eq!(b, a + 1);
        let ids =
            Spi::get_one::<Vec<i64>>("SELECT pgque.send_batch('t1', 'ty', ARRAY['p', 'q', 'r'])")
                .unwrap()
                .unwrap();
        assert_eq!(ids, vec![b + 1, b + 2, b + 3]);
        let empty = Spi::get_one::<Vec<i64>>("SELECT pgque.send_batch('t1', ARRAY[]::text[])")
            .unwrap()
            .unwrap();
        assert!(empty.is_empty());
        // Five event ids taken since the queue's first tick.
        assert_eq!(
            one_i64("SELECT ev_new FROM pgque.get_queue_info('t1')"),
            Some(5)
        );
        assert_eq!(
            one_i64("SELECT count(*) FROM pgque.get_consumer_info('t1')"),
            Some(1)
        );
    }

    #[pg_test]
    fn ticker_ticks_queues_with_new_events_only() {
        Spi::run("SELECT pgque.create_queue('t2')").unwrap();
        // Nothing new since create_queue's tick: no tick.
        assert_eq!(one_i64("SELECT pgque.ticker('t2')"), None);
        Spi::run("SELECT pgque.send('t2', 'x'::text)").unwrap();
        let t = one_i64("SELECT pgque.ticker('t2')").unwrap();
        // Paused queues are ticked only by force.
        Spi::run("SELECT pgque.set_queue_config('t2', 'ticker_paused', 'true')").unwrap();
        Spi::run("SELECT pgque.send('t2', 'y'::text)").unwrap();
        assert_eq!(one_i64("SELECT pgque.ticker('t2')"), None);
        let f = one_i64("SELECT pgque.force_tick('t2')").unwrap();
        assert!(f > t);
        assert_eq!(
            one_i64("SELECT last_tick_id FROM pgque.get_queue_info('t2')"),
            Some(f)
        );
    }

    #[pg_test]
    fn set_queue_config_sets_and_null_resets() {
        Spi::run("SELECT pgque.create_queue('t3')").unwrap();
        Spi::run("SELECT pgque.set_queue_config('t3', 'ticker_max_count', '42')").unwrap();
        Spi::run("SELECT pgque.set_queue_config('t3', 'queue_ticker_max_lag', '250ms')").unwrap();
        Spi::run("SELECT pgque.set_queue_config('t3', 'rotation_period', '10 minutes')").unwrap();
        assert_eq!(
            one_i32("SELECT queue_ticker_max_count FROM pgque.get_queue_info('t3')"),
            Some(42)
        );
        assert_eq!(
            Spi::get_one::<bool>(
                "SELECT queue_ticker_max_lag = interval '250 ms' AND queue_rotation_period = interval '10 min' \
                   FROM pgque.get_queue_info('t3')"
            )
            .unwrap(),
            Some(true)
        );
        Spi::run("SELECT pgque.set_queue_config('t3', 'ticker_max_count', NULL)").unwrap();
        Spi::run("SELECT pgque.set_queue_config('t3', 'rotation_period', NULL)").unwrap();
        assert_eq!(
            Spi::get_one::<bool>(
                "SELECT queue_ticker_max_count = 500 AND queue_rotation_period = interval '2 hours' \
                   FROM pgque.get_queue_info('t3')"
            )
            .unwrap(),
            Some(true)
        );
    }

    #[pg_test(error = "queue not found: \"nope\"")]
    fn unknown_queue_is_an_error() {
        Spi::run("SELECT pgque.send('nope', 'x'::text)").unwrap();
    }

    #[pg_test(error = "consumer \"a#b\" must not contain '#'")]
    fn hash_in_a_plain_consumer_name_is_refused() {
        Spi::run("SELECT pgque.create_queue('t4')").unwrap();
        Spi::run("SELECT pgque.subscribe('t4', 'a#b')").unwrap();
    }

    #[pg_test]
    fn maint_and_drop_queue() {
        Spi::run("SELECT pgque.create_queue('t5')").unwrap();
        assert!(one_i32("SELECT pgque.maint()").unwrap() >= 0);
        assert!(one_i64("SELECT count(*) FROM pgque.maint_operations()").unwrap() >= 3);
        let qid = one_i32("SELECT queue_id FROM pgque.queue WHERE queue_name = 't5'").unwrap();
        let table = format!("SELECT to_regclass('pgque.event_{qid}_0') IS NULL");
        assert_eq!(Spi::get_one::<bool>(&table).unwrap(), Some(false));
        assert_eq!(one_i32("SELECT pgque.drop_queue('t5')"), Some(1));
        assert_eq!(Spi::get_one::<bool>(&table).unwrap(), Some(true));
        assert_eq!(
            one_i64("SELECT count(*) FROM pgque.get_queue_info()"),
            Some(0)
        );
    }
}
