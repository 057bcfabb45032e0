//! The send path below SQL (src/log/direct.rs): send, send_batch and
//! insert_event write the queue's event table with heap_multi_insert and
//! ExecInsertIndexTuples. These tests hold it to the row, the index entries
//! and the transaction semantics the SQL INSERT gives, and check that a table
//! the direct path must not write (a trigger, a CHECK constraint, a
//! read-only transaction) goes through the SQL INSERT.
mod events_util;
use events_util::gen::Gen;
use events_util::*;
use pgque_pg_test::*;

/// Every event row of queue `q` sent in this transaction is the row the SQL
/// INSERT would have written: ev_time = now(), ev_txid =
/// pg_current_xact_id(), and it is visible to the transaction's next statement.
fn rows_of_this_txn(c: &mut pgque_pg_test::postgres::Transaction, q: &str) -> i64 {
    let id = qid(c, q);
    c.query_one(
        &format!(
            "SELECT count(*) FROM pgque.event_{id} \
              WHERE ev_time = now() AND ev_txid = pg_current_xact_id()"
        ),
        &[],
    )
    .unwrap()
    .get(0)
}

fn qid(c: &mut pgque_pg_test::postgres::Transaction, q: &str) -> i32 {
    c.query_one(
        "SELECT queue_id FROM pgque.queue WHERE queue_name = $1",
        &[&q],
    )
    .unwrap()
    .get(0)
}

#[test]
fn direct_rows_equal_the_sql_insert() {
    let db = manual_db("ev_direct_rows");
    let mut c = db.connect();
    // A partitioned consumer gives the tables their slot (expression) indexes.
    c.batch_execute(
        "CREATE EXTENSION IF NOT EXISTS amcheck; \
         SELECT pgque.create_queue('q'); SELECT pgque.register_consumer('q', 'c'); \
         SELECT pgque.subscribe_partitioned('q', 'p', 4)",
    )
    .unwrap();
    // The payloads: jsonb of every kind, a NULL, multi-byte text, one big
    // enough to be compressed/toasted, a two-dimensional array.
    c.batch_execute(
        "CREATE TEMP TABLE want (k int, ev_type text, ev_data text, ev_extra1 text); \
         CREATE TEMP TABLE jp AS SELECT ARRAY[ \
             '{\"a\": 1, \"b\": [1, 2.50, -3e2, true, false, null], \"c\": {\"d\": \"x\\\"y\\\\z\\n\"}}', \
             '[]', '{}', '\"str\"', '12.3400', 'null', NULL, \
             '{\"ключ\": \"значение ✓\", \"e\": \"\\u0001\\t\"}']::jsonb[] AS a, \
           ARRAY['plain', NULL, repeat('big ', 5000), '']::text[] AS t",
    )
    .unwrap();
    let mut tx = c.transaction().unwrap();
    let ids: Vec<i64> = tx
        .query_one("SELECT pgque.send_batch('q', (SELECT a FROM jp))", &[])
        .unwrap()
        .get(0);
    assert_eq!(ids.len(), 8);
    let tids: Vec<i64> = tx
        .query_one(
            "SELECT pgque.send_batch('q', 'tt', (SELECT t FROM jp))",
            &[],
        )
        .unwrap()
        .get(0);
    let kids: Vec<i64> = tx
        .query_one(
            "SELECT pgque.send_batch('q', 'kk', ARRAY[['1', '2'], ['3', '4']]::text[], \
                                     ARRAY['k1', NULL, 'k3', 'k4'])",
            &[],
        )
        .unwrap()
        .get(0);
    assert_eq!(kids.len(), 4);
    let one: i64 = tx
        .query_one(
            "SELECT pgque.send('q', 'one', '{\"z\": [1, {\"y\": 2}]}'::jsonb, 'pk')",
            &[],
        )
        .unwrap()
        .get(0);
    let raw: i64 = tx
        .query_one(
            "SELECT pgque.insert_event('q', NULL, NULL, 'e1', NULL, 'e3', 'e4')",
            &[],
        )
        .unwrap()
        .get(0);
    // visible at once, with the defaults' values
    assert_eq!(rows_of_this_txn(&mut tx, "q"), 8 + 4 + 4 + 1 + 1);
    let q = qid(&mut tx, "q");
    let got = |tx: &mut pgque_pg_test::postgres::Transaction, sql: &str| -> bool {
        tx.query_one(sql, &[]).unwrap().get(0)
    };
    // jsonb payloads: stored as jsonb::text, in input order
    assert!(got(
        &mut tx,
        &format!(
            "SELECT array_agg(e.ev_data ORDER BY e.ev_id) IS NOT DISTINCT FROM \
                    (SELECT array_agg(x::text ORDER BY o) FROM jp, unnest(jp.a) WITH ORDINALITY u(x, o)) \
                    AND bool_and(e.ev_type = 'default' AND e.ev_extra1 IS NULL AND e.ev_owner IS NULL \
                                 AND e.ev_retry IS NULL AND e.ev_extra4 IS NULL) \
               FROM pgque.event_{q} e WHERE e.ev_id = ANY($${{{}}}$$::int8[])",
            ids.iter().map(|i| i.to_string()).collect::<Vec<_>>().join(",")
        )
    ));
    assert!(got(
        &mut tx,
        &format!(
            "SELECT array_agg(e.ev_data ORDER BY e.ev_id) IS NOT DISTINCT FROM (SELECT t FROM jp) \
                    AND bool_and(e.ev_type = 'tt') \
               FROM pgque.event_{q} e WHERE e.ev_id = ANY($${{{}}}$$::int8[])",
            tids.iter()
                .map(|i| i.to_string())
                .collect::<Vec<_>>()
                .join(",")
        )
    ));
    assert!(got(
        &mut tx,
        &format!(
            "SELECT array_agg(e.ev_data || ':' || coalesce(e.ev_extra1, '-') ORDER BY e.ev_id) \
                    = ARRAY['1:k1', '2:-', '3:k3', '4:k4'] \
               FROM pgque.event_{q} e WHERE e.ev_id = ANY($${{{}}}$$::int8[])",
            kids.iter()
                .map(|i| i.to_string())
                .collect::<Vec<_>>()
                .join(",")
        )
    ));
    assert!(got(
        &mut tx,
        &format!(
            "SELECT ev_type = 'one' AND ev_data = '{{\"z\": [1, {{\"y\": 2}}]}}' AND ev_extra1 = 'pk' \
               FROM pgque.event_{q} WHERE ev_id = {one}"
        )
    ));
    assert!(got(
        &mut tx,
        &format!(
            "SELECT ev_type IS NULL AND ev_data IS NULL AND ev_extra1 = 'e1' AND ev_extra2 IS NULL \
                    AND ev_extra3 = 'e3' AND ev_extra4 = 'e4' \
               FROM pgque.event_{q} WHERE ev_id = {raw}"
        )
    ));
    tx.commit().unwrap();
    // Every heap row has its entry in every index of the table (amcheck's
    // heapallindexed), the slot indexes' expression entries included.
    let idx: Vec<String> = c
        .query(
            &format!(
                "SELECT indexrelid::regclass::text FROM pg_index \
                  WHERE indrelid = 'pgque.event_{q}_0'::regclass"
            ),
            &[],
        )
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert!(!idx.is_empty());
    for i in &idx {
        c.execute(
            &format!("SELECT bt_index_check('{i}'::regclass, true)"),
            &[],
        )
        .unwrap();
    }
    // the consumer gets them all, in id order, with the same text
    tick(&mut c, "q");
    let rows = c
        .query(
            "SELECT msg_id, payload FROM pgque.receive('q', 'c', 100)",
            &[],
        )
        .unwrap();
    assert_eq!(rows.len(), 18);
    let big: Option<String> = rows
        .iter()
        .find(|r| r.get::<_, i64>(0) == tids[2])
        .unwrap()
        .get(1);
    assert_eq!(big.unwrap().len(), 20000);
}

#[test]
fn direct_subtransactions_and_rollback() {
    let db = manual_db("ev_direct_subxact");
    let mut c = db.connect();
    c.batch_execute("SELECT pgque.create_queue('q'); SELECT pgque.register_consumer('q', 'c')")
        .unwrap();
    let mut tx = c.transaction().unwrap();
    tx.batch_execute(
        "SAVEPOINT s; SELECT pgque.send_batch('q', ARRAY['gone1', 'gone2']); ROLLBACK TO s; \
         SAVEPOINT t; SELECT pgque.send('q', 'kept'::text); RELEASE t",
    )
    .unwrap();
    // ev_txid is the top transaction's id, as pg_current_xact_id() gives
    assert_eq!(rows_of_this_txn(&mut tx, "q"), 1);
    tx.commit().unwrap();
    let mut tx = c.transaction().unwrap();
    tx.execute("SELECT pgque.send('q', 'rolled back'::text)", &[])
        .unwrap();
    tx.rollback().unwrap();
    tick(&mut c, "q");
    let rows = c
        .query("SELECT payload FROM pgque.receive('q', 'c', 100)", &[])
        .unwrap();
    let got: Vec<String> = rows.iter().map(|r| r.get(0)).collect();
    assert_eq!(got, vec!["kept".to_string()]);
}

#[test]
fn tables_the_direct_path_must_not_write_take_the_sql_insert() {
    let db = manual_db("ev_direct_fallback");
    let mut c = db.connect();
    c.batch_execute("SELECT pgque.create_queue('q'); SELECT pgque.register_consumer('q', 'c')")
        .unwrap();
    let q: i32 = c
        .query_one(
            "SELECT queue_id FROM pgque.queue WHERE queue_name = 'q'",
            &[],
        )
        .unwrap()
        .get(0);
    // A read-only transaction: the SQL INSERT's error, nothing written.
    let mut tx = c.transaction().unwrap();
    tx.batch_execute("SET TRANSACTION READ ONLY").unwrap();
    assert_eq!(
        sqlstate(tx.execute("SELECT pgque.send('q', 'x'::text)", &[])),
        "25006"
    );
    tx.rollback().unwrap();
    let mut tx = c.transaction().unwrap();
    tx.batch_execute("SET TRANSACTION READ ONLY").unwrap();
    assert_eq!(
        sqlstate(tx.execute("SELECT pgque.send_batch('q', ARRAY['x'])", &[])),
        "25006"
    );
    tx.rollback().unwrap();
    // A trigger on the event table runs for every send.
    c.batch_execute(&format!(
        "CREATE FUNCTION public.mark() RETURNS trigger LANGUAGE plpgsql AS \
           $$BEGIN NEW.ev_extra2 := 'trig'; RETURN NEW; END$$; \
         CREATE TRIGGER mark BEFORE INSERT ON pgque.event_{q}_0 \
           FOR EACH ROW EXECUTE FUNCTION public.mark()"
    ))
    .unwrap();
    c.batch_execute(
        "SELECT pgque.send('q', 'a'::text); SELECT pgque.send_batch('q', ARRAY['b', 'c']); \
         SELECT pgque.send_batch('q', ARRAY['{\"d\": 1}']::jsonb[]); \
         SELECT pgque.insert_event('q', 't', 'e')",
    )
    .unwrap();
    let marked: i64 = c
        .query_one(
            &format!("SELECT count(*) FROM pgque.event_{q}_0 WHERE ev_extra2 = 'trig'"),
            &[],
        )
        .unwrap()
        .get(0);
    assert_eq!(marked, 5);
    // A CHECK constraint is enforced (23514), and the failed send left nothing.
    c.batch_execute(&format!(
        "DROP TRIGGER mark ON pgque.event_{q}_0; \
         ALTER TABLE pgque.event_{q}_0 ADD CONSTRAINT no_bad CHECK (ev_data IS DISTINCT FROM 'bad')"
    ))
    .unwrap();
    assert_eq!(
        sqlstate(c.execute("SELECT pgque.send_batch('q', ARRAY['ok', 'bad'])", &[])),
        "23514"
    );
    assert_eq!(
        sqlstate(c.execute("SELECT pgque.send('q', 'bad'::text)", &[])),
        "23514"
    );
    c.batch_execute(&format!(
        "ALTER TABLE pgque.event_{q}_0 DROP CONSTRAINT no_bad; \
         SELECT pgque.send_batch('q', ARRAY['after'])"
    ))
    .unwrap();
    tick(&mut c, "q");
    let rows = c
        .query("SELECT payload FROM pgque.receive('q', 'c', 100)", &[])
        .unwrap();
    let got: Vec<String> = rows.iter().map(|r| r.get(0)).collect();
    assert_eq!(got, vec!["a", "b", "c", "{\"d\": 1}", "e", "after"]);
}

#[test]
fn direct_jsonb_payloads_are_stored_as_jsonb_out_writes_them() {
    let db = manual_db("ev_direct_jsontext");
    let mut c = db.connect();
    c.batch_execute("SELECT pgque.create_queue('q')").unwrap();
    let q: i32 = c
        .query_one(
            "SELECT queue_id FROM pgque.queue WHERE queue_name = 'q'",
            &[],
        )
        .unwrap()
        .get(0);
    let mut g = Gen(33);
    let mut total = 0;
    for round in 0..6 {
        let texts: Vec<String> = (0..500).map(|_| g.value(0)).collect();
        let ids: Vec<i64> = c
            .query_one(
                "SELECT pgque.send_batch('q', $1::text[]::jsonb[])",
                &[&texts],
            )
            .unwrap()
            .get(0);
        assert_eq!(ids.len(), texts.len());
        // the single send's jsonb argument goes the same way
        let one: i64 = c
            .query_one("SELECT pgque.send('q', $1::text::jsonb)", &[&texts[round]])
            .unwrap()
            .get(0);
        let bad: Vec<(i64, String, String)> = c
            .query(
                &format!(
                    "SELECT e.ev_id, e.ev_data, t.x::jsonb::text \
                       FROM unnest($1::int8[], $2::text[]) t(id, x) \
                       JOIN pgque.event_{q} e ON e.ev_id = t.id \
                      WHERE e.ev_data IS DISTINCT FROM t.x::jsonb::text"
                ),
                &[
                    &[ids.clone(), vec![one]].concat(),
                    &[texts.clone(), vec![texts[round].clone()]].concat(),
                ],
            )
            .unwrap()
            .iter()
            .map(|r| (r.get(0), r.get(1), r.get(2)))
            .collect();
        assert!(
            bad.is_empty(),
            "ev_data differs from jsonb::text: {:?}",
            &bad[..bad.len().min(3)]
        );
        total += ids.len() + 1;
    }
    let n: i64 = c
        .query_one(&format!("SELECT count(*) FROM pgque.event_{q}"), &[])
        .unwrap()
        .get(0);
    assert_eq!(n as usize, total);
}

/// The table a send of `q` wrote its last row to: the `n` of event_<id>_<n>.
fn table_of_last(c: &mut pgque_pg_test::postgres::Client, q: &str, id: i64) -> String {
    let qid: i32 = c
        .query_one(
            "SELECT queue_id FROM pgque.queue WHERE queue_name = $1",
            &[&q],
        )
        .unwrap()
        .get(0);
    c.query_one(
        &format!("SELECT tableoid::regclass::text FROM pgque.event_{qid} WHERE ev_id = $1"),
        &[&id],
    )
    .unwrap()
    .get(0)
}

/// The send path finds its queue below SQL (src/log/qlookup.rs): it must see
/// what the SQL lookup saw. A queue made or dropped earlier in the same
/// transaction or statement, a current table switched by this transaction or
/// committed by another session since the transaction began, an unknown name.
#[test]
fn the_queue_lookup_below_sql_sees_what_the_sql_lookup_saw() {
    let db = manual_db("ev_direct_lookup");
    let mut c = db.connect();
    // made in the same statement, and in the same transaction
    let id: i64 = c
        .query_one(
            "SELECT pgque.create_queue('q1'), pgque.send('q1', '{\"a\": 1}'::jsonb)",
            &[],
        )
        .unwrap()
        .get(1);
    assert!(id > 0);
    let mut tx = c.transaction().unwrap();
    tx.execute("SELECT pgque.create_queue('q2')", &[]).unwrap();
    let ids: Vec<i64> = tx
        .query_one("SELECT pgque.send_batch('q2', ARRAY['a', 'b'])", &[])
        .unwrap()
        .get(0);
    assert_eq!(ids.len(), 2);
    tx.commit().unwrap();
    // unknown, and dropped earlier in the same transaction: 42704, nothing written
    assert_eq!(
        sqlstate(c.execute("SELECT pgque.send('nope', 'x'::text)", &[])),
        "42704"
    );
    let mut tx = c.transaction().unwrap();
    tx.execute("SELECT pgque.drop_queue('q2')", &[]).unwrap();
    assert_eq!(
        sqlstate(tx.execute("SELECT pgque.send_batch('q2', ARRAY['c'])", &[])),
        "42704"
    );
    tx.rollback().unwrap();
    // the current table switched by this transaction: the send follows it
    let mut tx = c.transaction().unwrap();
    tx.execute(
        "UPDATE pgque.queue SET queue_cur_table = 1 WHERE queue_name = 'q1'",
        &[],
    )
    .unwrap();
    let in_tx: i64 = tx
        .query_one("SELECT pgque.send('q1', 'y'::text)", &[])
        .unwrap()
        .get(0);
    tx.commit().unwrap();
    let qid: i32 = c
        .query_one(
            "SELECT queue_id FROM pgque.queue WHERE queue_name = 'q1'",
            &[],
        )
        .unwrap()
        .get(0);
    assert_eq!(
        table_of_last(&mut c, "q1", in_tx),
        format!("pgque.event_{qid}_1")
    );
    // switched and committed by another session after this transaction's
    // first statement: the next statement's send sees it (READ COMMITTED)
    let mut tx = c.transaction().unwrap();
    tx.execute("SELECT 1", &[]).unwrap();
    let mut other = db.connect();
    other
        .execute(
            "UPDATE pgque.queue SET queue_cur_table = 2 WHERE queue_name = 'q1'",
            &[],
        )
        .unwrap();
    let after: i64 = tx
        .query_one("SELECT pgque.send('q1', 'z'::text)", &[])
        .unwrap()
        .get(0);
    tx.commit().unwrap();
    assert_eq!(
        table_of_last(&mut c, "q1", after),
        format!("pgque.event_{qid}_2")
    );
}
