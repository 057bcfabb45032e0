//! pgque in the kinds of database users make (DESIGN.md section 25), each
//! path below SQL held to the SQL it stands for.
//!
//! The tier's own databases already have a real default (pg_test/run.sh:
//! libc en_US.UTF-8 on 14, ICU on 15, the builtin provider on 18); these
//! tests make every other kind this server can make, side by side: C, libc
//! en_US.UTF-8, ICU en-US (a build with ICU), builtin C.UTF-8 (17 and
//! later), and databases in another encoding, which pgque refuses.
//!
//! The differential tests generate their inputs (events_util/gen.rs) and
//! require the same result, SQLSTATE and stored bytes from
//! - the queue lookup by index probe (src/log/qlookup.rs) and the SQL
//!   lookup `WHERE queue_name = $1`, through send, send_batch, insert_event
//!   and a capture trigger;
//! - the jsonb rendering (src/jsontext.rs) and `jsonb::text`;
//! - the direct heap insert (src/log/direct.rs) and the SQL INSERT, which a
//!   CHECK constraint on the event tables makes the send path take.
mod events_util;
use events_util::gen::Gen;
use pgque_pg_test::postgres::Client;
use pgque_pg_test::*;
use std::sync::Mutex;

/// One database per kind at a time per binary: CREATE EXTENSION in two
/// databases at once can race on creating the cluster-wide roles.
static CREATE: Mutex<()> = Mutex::new(());

/// A kind of database: its name (for the database's name and messages),
/// the CREATE DATABASE options that make it, and the collation provider
/// pg_database must then name ('c' libc, 'i' ICU, 'b' builtin).
struct Kind {
    name: &'static str,
    options: String,
    provider: char,
}

/// CREATE DATABASE options from template0 with a libc locale: the
/// provider is named on 15 and later, where template0 otherwise passes on
/// the cluster's (ICU or builtin on this tier's 15 and 18).
fn libc(encoding: &str, locale: &str) -> String {
    let provider = if major() >= 15 {
        " LOCALE_PROVIDER libc"
    } else {
        ""
    };
    format!("TEMPLATE template0 ENCODING '{encoding}' LOCALE '{locale}'{provider}")
}

/// The UTF8 kinds this server can make.
fn kinds() -> Vec<Kind> {
    let mut admin = connect_to("postgres");
    let mut out = vec![
        Kind {
            name: "c",
            options: libc("UTF8", "C"),
            provider: 'c',
        },
        Kind {
            name: "libc",
            options: libc("UTF8", "en_US.UTF-8"),
            provider: 'c',
        },
    ];
    // whether this build has ICU: the server says so when asked for an ICU
    // database (0A000 "ICU is not supported in this build")
    let icu_options = "TEMPLATE template0 ENCODING 'UTF8' LOCALE 'en_US.UTF-8' \
                       LOCALE_PROVIDER icu ICU_LOCALE 'en-US'";
    let icu = major() >= 15 && {
        let _g = CREATE.lock().unwrap_or_else(|e| e.into_inner());
        admin
            .batch_execute("DROP DATABASE IF EXISTS rd_icu_probe")
            .unwrap();
        let made = admin.batch_execute(&format!("CREATE DATABASE rd_icu_probe {icu_options}"));
        match made {
            Ok(()) => {
                admin.batch_execute("DROP DATABASE rd_icu_probe").unwrap();
                true
            }
            Err(e) if e.code().map(|c| c.code()) == Some("0A000") => false,
            Err(e) => panic!("CREATE DATABASE ... LOCALE_PROVIDER icu: {e:?}"),
        }
    };
    if icu {
        out.push(Kind {
            name: "icu",
            options: icu_options.to_string(),
            provider: 'i',
        });
    } else {
        eprintln!("real_databases: this PostgreSQL {} has no ICU", major());
    }
    if major() >= 17 {
        out.push(Kind {
            name: "builtin",
            options: "TEMPLATE template0 ENCODING 'UTF8' LOCALE 'en_US.UTF-8' \
                      LOCALE_PROVIDER builtin BUILTIN_LOCALE 'C.UTF-8'"
                .to_string(),
            provider: 'b',
        });
    }
    out
}

/// A database of `kind` (dropped at the end of the test), with pgque when
/// `ext`, its worker stopped: ticks happen when a test asks.
struct KindDb {
    name: String,
}

impl KindDb {
    fn new(test: &str, kind: &Kind, ext: bool) -> KindDb {
        let _g = CREATE.lock().unwrap_or_else(|e| e.into_inner());
        let name = format!("rd_{test}_{}", kind.name);
        let mut admin = connect_to("postgres");
        admin
            .batch_execute(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
            .unwrap();
        admin
            .batch_execute(&format!("CREATE DATABASE {name} {}", kind.options))
            .unwrap_or_else(|e| panic!("CREATE DATABASE {name} {}: {e}", kind.options));
        let db = KindDb { name };
        if major() >= 15 {
            let (provider, collate): (i8, String) = db
                .connect()
                .query_one(
                    "SELECT datlocprovider, datcollate::text \
                     FROM pg_database WHERE datname = current_database()",
                    &[],
                )
                .map(|r| (r.get(0), r.get(1)))
                .unwrap();
            assert_eq!(
                provider as u8 as char, kind.provider,
                "{}: {collate}",
                db.name
            );
        }
        if ext {
            let mut c = db.connect();
            c.batch_execute("CREATE EXTENSION pgque").unwrap();
            stop_worker(&mut c);
        }
        db
    }
    fn connect(&self) -> Client {
        connect_to(&self.name)
    }
}

impl Drop for KindDb {
    fn drop(&mut self) {
        if let Ok(mut admin) = pgque_pg_test::postgres::Client::connect(
            &conninfo("postgres", "postgres"),
            pgque_pg_test::postgres::NoTls,
        ) {
            let _ = admin.batch_execute(&format!(
                "DROP DATABASE IF EXISTS {} WITH (FORCE)",
                self.name
            ));
        }
    }
}

/// The SQL lookup the probe stands for: the queue's id, or None.
fn oracle(c: &mut Client, name: &str) -> Option<i32> {
    c.query_opt(
        "SELECT queue_id FROM pgque.queue WHERE queue_name = $1",
        &[&name],
    )
    .unwrap()
    .map(|r| r.get(0))
}

/// The names the review tried by hand, then generated ones: letters of both
/// cases, accents, scripts, punctuation, a supplementary-plane character.
fn names() -> Vec<String> {
    let mut out: Vec<String> = [
        "orders",
        "Orders",
        "billing",
        "B",
        "a",
        "orders-eu",
        "orders_eu",
        "Orders EU",
        "z",
        "Zebra",
        "émile",
        "Émile",
        "straße",
    ]
    .map(String::from)
    .to_vec();
    let mut g = Gen(42);
    while out.len() < 240 {
        let n = g.name();
        if !out.contains(&n) {
            out.push(n);
        }
    }
    out
}

#[test]
fn send_finds_every_queue_as_the_sql_lookup_does_in_every_kind_of_database() {
    let names = names();
    for kind in kinds() {
        let db = KindDb::new("probe", &kind, true);
        let mut c = db.connect();
        // two of every three names become queues, in generated order, and
        // a few of those are dropped again: the btree holds live and dead
        // entries in the database's own order
        let mut g = Gen(7);
        for (i, n) in names.iter().enumerate() {
            if i % 3 != 2 {
                c.execute("SELECT pgque.create_queue($1)", &[n]).unwrap();
            }
        }
        for n in names
            .iter()
            .skip(13)
            .filter(|_| g.next().is_multiple_of(10))
        {
            c.execute("SELECT pgque.drop_queue($1, true)", &[n]).ok();
        }
        let mut found = 0;
        for n in &names {
            let want = oracle(&mut c, n);
            let mut tx = c.transaction().unwrap();
            let one = tx.query_one("SELECT pgque.send($1, 'x'::text)", &[n]);
            let batch = tx.query_one("SELECT pgque.send_batch($1, ARRAY['a', 'b'])", &[n]);
            let ins = tx.query_one("SELECT pgque.insert_event($1, 't', 'd')", &[n]);
            match want {
                Some(qid) => {
                    let one: i64 = one
                        .unwrap_or_else(|e| panic!("{}: send({n:?}) of a queue: {e:?}", kind.name))
                        .get(0);
                    let batch: Vec<i64> = batch
                        .unwrap_or_else(|e| panic!("{}: send_batch({n:?}): {e:?}", kind.name))
                        .get(0);
                    let ins: i64 = ins
                        .unwrap_or_else(|e| panic!("{}: insert_event({n:?}): {e:?}", kind.name))
                        .get(0);
                    let ids = [vec![one, ins], batch].concat();
                    let n_stored: i64 = tx
                        .query_one(
                            &format!(
                                "SELECT count(*) FROM pgque.event_{qid} WHERE ev_id = ANY ($1)"
                            ),
                            &[&ids],
                        )
                        .unwrap()
                        .get(0);
                    assert_eq!(
                        n_stored, 4,
                        "{}: {n:?}'s events are in its own queue",
                        kind.name
                    );
                    found += 1;
                }
                None => {
                    assert_eq!(
                        sqlstate(one),
                        "42704",
                        "{}: send({n:?}), no such queue",
                        kind.name
                    );
                }
            }
            tx.rollback().unwrap();
            if want.is_none() {
                // each call on its own: the first error aborted the transaction
                for sql in [
                    "SELECT pgque.send_batch($1, ARRAY['a'])",
                    "SELECT pgque.insert_event($1, 't', 'd')",
                ] {
                    assert_eq!(
                        sqlstate(c.query_one(sql, &[n])),
                        "42704",
                        "{}: {sql} {n:?}",
                        kind.name
                    );
                }
            }
        }
        assert!(
            found > names.len() / 2,
            "{}: {found} queues found",
            kind.name
        );

        // a capture trigger names its queue as a trigger argument (the
        // review's logutriga('Orders')); its rows go to that queue
        let qid = oracle(&mut c, "Orders").expect("Orders is a queue (the fixed names stay)");
        c.batch_execute(
            "CREATE TABLE t (id int PRIMARY KEY, v text); \
             CREATE TRIGGER cap AFTER INSERT OR UPDATE OR DELETE ON t \
                 FOR EACH ROW EXECUTE FUNCTION pgque.logutriga('Orders')",
        )
        .unwrap();
        c.batch_execute(
            "INSERT INTO t VALUES (1, 'é'), (2, 'x'); UPDATE t SET v = 'ß' WHERE id = 1",
        )
        .unwrap();
        let n: i64 = c
            .query_one(
                &format!("SELECT count(*) FROM pgque.event_{qid} WHERE ev_type LIKE 'I%' OR ev_type LIKE 'U%'"),
                &[],
            )
            .unwrap()
            .get(0);
        assert_eq!(n, 3, "{}: the trigger's events", kind.name);
    }
}

/// JSON texts for the rendering test: the generator's values (every kind,
/// numbers of every form, strings with every escape and every plane), and
/// the edges: empty containers and strings, a huge string, wide containers,
/// and nesting far deeper than the walk below SQL recurses.
fn json_texts() -> Vec<String> {
    let mut g = Gen(2026);
    let mut out: Vec<String> = (0..400).map(|_| g.value(0)).collect();
    out.extend(
        [
            "\"\"",
            "[]",
            "{}",
            "[[]]",
            "{\"\": {}}",
            "[\"\", [], {}]",
            "0",
            "null",
        ]
        .map(String::from),
    );
    out.push(format!("\"{}\"", "é✓😀".repeat(50_000)));
    out.push(format!(
        "{{{}}}",
        (0..2000)
            .map(|i| format!("\"k{i}\": {i}"))
            .collect::<Vec<_>>()
            .join(", ")
    ));
    for depth in [127, 128, 129, 1000, 10_000] {
        out.push(format!("{}{}", "[".repeat(depth), "]".repeat(depth)));
        out.push(format!(
            "{}1{}",
            "{\"a\": [".repeat(depth / 2),
            "]}".repeat(depth / 2)
        ));
    }
    out
}

/// The SQL result of `sql` for one text: Ok(text) or Err(SQLSTATE).
fn result_of(c: &mut Client, sql: &str, arg: &str) -> Result<String, String> {
    let mut tx = c.transaction().unwrap();
    let r = tx
        .query_one(sql, &[&arg])
        .map(|r| r.get::<_, String>(0))
        .map_err(|e| e.code().map(|s| s.code().to_string()).unwrap_or_default());
    tx.rollback().unwrap();
    r
}

#[test]
fn jsonb_payloads_are_stored_as_jsonb_text_in_every_kind_of_database() {
    let texts = json_texts();
    for kind in kinds() {
        let db = KindDb::new("jsonb", &kind, true);
        let mut c = db.connect();
        c.batch_execute("SELECT pgque.create_queue('q')").unwrap();
        let qid = oracle(&mut c, "q").unwrap();
        // a stack limit raised as far as the server lets a superuser: the
        // review's crash (a recursion per level with no check) needed one
        let limit: String = c
            .query_one(
                "SELECT CASE WHEN (SELECT setting::int FROM pg_settings WHERE name = 'max_stack_depth') < 7168 \
                        THEN '7MB' ELSE current_setting('max_stack_depth') END",
                &[],
            )
            .unwrap()
            .get(0);
        c.batch_execute(&format!("SET max_stack_depth = '{limit}'"))
            .unwrap_or_else(|e| {
                panic!("max_stack_depth {limit} (the server's stack rlimit?): {e:?}")
            });
        let started: String = c
            .query_one("SELECT pg_postmaster_start_time()::text", &[])
            .unwrap()
            .get(0);
        for t in &texts {
            let want = result_of(&mut c, "SELECT $1::jsonb::text", t);
            let got = {
                let mut tx = c.transaction().unwrap();
                let r = tx
                    .query_one("SELECT pgque.send('q', $1::jsonb)", &[t])
                    .and_then(|r| {
                        let id: i64 = r.get(0);
                        tx.query_one(
                            &format!("SELECT ev_data FROM pgque.event_{qid} WHERE ev_id = $1"),
                            &[&id],
                        )
                    })
                    .map(|r| r.get::<_, String>(0))
                    .map_err(|e| e.code().map(|s| s.code().to_string()).unwrap_or_default());
                tx.rollback().unwrap();
                r
            };
            let short = |s: &str| s.chars().take(80).collect::<String>();
            assert!(
                got == want,
                "{}: send of {:?} stored {:?}, jsonb::text gives {:?}",
                kind.name,
                short(t),
                got.as_ref().map(|s| short(s)),
                want.as_ref().map(|s| short(s))
            );
        }
        // nested as deep as jsonb_in takes under this stack limit (~50,000
        // levels at 7MB), made in the statement as the review made them
        for depth in [20_000i32, 30_000, 45_000] {
            let value = "(repeat('[', $1) || repeat(']', $1))::jsonb";
            let want: String = c
                .query_one(&format!("SELECT {value}::text"), &[&depth])
                .unwrap()
                .get(0);
            let mut tx = c.transaction().unwrap();
            let id: i64 = tx
                .query_one(&format!("SELECT pgque.send('q', {value})"), &[&depth])
                .unwrap_or_else(|e| panic!("{}: {depth} levels: {e:?}", kind.name))
                .get(0);
            let got: String = tx
                .query_one(
                    &format!("SELECT ev_data FROM pgque.event_{qid} WHERE ev_id = $1"),
                    &[&id],
                )
                .unwrap()
                .get(0);
            assert!(
                got == want,
                "{}: {depth} levels stored otherwise",
                kind.name
            );
            tx.rollback().unwrap();
        }
        // send_batch of all of them at once (those jsonb_in takes)
        let ok: Vec<String> = texts
            .iter()
            .filter(|t| result_of(&mut c, "SELECT $1::jsonb::text", t).is_ok())
            .cloned()
            .collect();
        let ids: Vec<i64> = c
            .query_one("SELECT pgque.send_batch('q', $1::text[]::jsonb[])", &[&ok])
            .unwrap()
            .get(0);
        let bad: i64 = c
            .query_one(
                &format!(
                    "SELECT count(*) FROM unnest($1::int8[], $2::text[]) t(id, x) \
                     JOIN pgque.event_{qid} e ON e.ev_id = t.id \
                     WHERE e.ev_data IS DISTINCT FROM t.x::jsonb::text"
                ),
                &[&ids, &ok],
            )
            .unwrap()
            .get(0);
        assert_eq!(
            bad, 0,
            "{}: send_batch rows that differ from jsonb::text",
            kind.name
        );
        // the server never restarted: no backend crashed on a deep value
        let now: String = c
            .query_one("SELECT pg_postmaster_start_time()::text", &[])
            .unwrap()
            .get(0);
        assert_eq!(now, started, "{}: the server restarted", kind.name);
    }
}

/// Text payloads, types and partition keys from every plane, sent by the
/// direct heap insert into queue `d` and by the SQL INSERT into queue `s`
/// (whose event tables have a CHECK constraint, which the direct path
/// leaves to SQL): the two queues' rows hold the same bytes.
#[test]
fn the_direct_insert_stores_what_the_sql_insert_stores_in_every_kind_of_database() {
    let mut g = Gen(99);
    let texts: Vec<String> = (0..300)
        .map(|i| match i % 4 {
            0 => g.string(),
            1 => g.name(),
            2 => format!("{}{}", g.name(), g.string()),
            _ => "é✓😀𠀀".repeat(1 + (g.next() % 3000) as usize),
        })
        .collect();
    let keys: Vec<Option<String>> = (0..texts.len())
        .map(|i| (i % 5 != 0).then(|| g.name()))
        .collect();
    for kind in kinds() {
        let db = KindDb::new("direct", &kind, true);
        let mut c = db.connect();
        c.batch_execute(
            "SELECT pgque.create_queue('d'); SELECT pgque.create_queue('s'); \
             SELECT pgque.subscribe_partitioned('d', 'p', 4); \
             SELECT pgque.subscribe_partitioned('s', 'p', 4)",
        )
        .unwrap();
        let (d, s) = (oracle(&mut c, "d").unwrap(), oracle(&mut c, "s").unwrap());
        for n in 0..3 {
            c.batch_execute(&format!(
                "ALTER TABLE pgque.event_{s}_{n} ADD CONSTRAINT via_sql CHECK (ev_retry IS NULL OR ev_retry >= 0)"
            ))
            .unwrap();
        }
        for q in ["d", "s"] {
            let ids: Vec<i64> = c
                .query_one(
                    "SELECT pgque.send_batch($1, 'ty☃', $2::text[], $3::text[])",
                    &[&q, &texts, &keys],
                )
                .unwrap()
                .get(0);
            assert_eq!(ids.len(), texts.len());
            for (t, k) in texts.iter().zip(&keys).take(20) {
                c.query_one(
                    "SELECT pgque.send($1::text, $2::text, $3::text, $4::text)",
                    &[&q, &"one✓", t, k],
                )
                .unwrap();
            }
        }
        let diff: i64 = c
            .query_one(
                &format!(
                    "WITH a AS (SELECT row_number() OVER (ORDER BY ev_id) AS n, ev_type, ev_data, ev_extra1, \
                                       ev_extra2, ev_extra3, ev_extra4, ev_headers FROM pgque.event_{d}), \
                          b AS (SELECT row_number() OVER (ORDER BY ev_id) AS n, ev_type, ev_data, ev_extra1, \
                                       ev_extra2, ev_extra3, ev_extra4, ev_headers FROM pgque.event_{s}) \
                     SELECT count(*) FROM a FULL JOIN b USING (n) \
                     WHERE (a.ev_type, a.ev_data, a.ev_extra1, a.ev_extra2, a.ev_extra3, a.ev_extra4, a.ev_headers::text) \
                           IS DISTINCT FROM \
                           (b.ev_type, b.ev_data, b.ev_extra1, b.ev_extra2, b.ev_extra3, b.ev_extra4, b.ev_headers::text)"
                ),
                &[],
            )
            .unwrap()
            .get(0);
        assert_eq!(
            diff, 0,
            "{}: rows of the direct insert that differ from the SQL insert's",
            kind.name
        );
        // and each key's events went to the slot its hash names, by either path
        let slots: i64 = c
            .query_one(
                &format!(
                    "SELECT count(*) FROM pgque.event_{d} a JOIN pgque.event_{s} b USING (ev_extra1) \
                     WHERE pgque.partition_slot(a.ev_extra1, 4) <> pgque.partition_slot(b.ev_extra1, 4)"
                ),
                &[],
            )
            .unwrap()
            .get(0);
        assert_eq!(slots, 0, "{}", kind.name);
    }
}

/// A database in another encoding than UTF8: CREATE EXTENSION refuses it
/// with 0A000 before it creates anything.
#[test]
fn create_extension_refuses_a_database_that_is_not_utf8() {
    for (name, options) in [
        ("latin1", libc("LATIN1", "en_US.ISO-8859-1")),
        ("sqlascii", libc("SQL_ASCII", "C")),
    ] {
        let kind = Kind {
            name,
            options,
            provider: 'c',
        };
        let db = KindDb::new("enc", &kind, false);
        let mut c = db.connect();
        let e = c.batch_execute("CREATE EXTENSION pgque").unwrap_err();
        let code = e.code().map(|s| s.code().to_string());
        assert_eq!(code.as_deref(), Some("0A000"), "{name}: {e}");
        let msg = e
            .as_db_error()
            .map(|d| d.message().to_string())
            .unwrap_or_default();
        assert!(msg.contains("UTF8"), "{name}: {msg}");
        let left: i64 = c
            .query_one(
                "SELECT (SELECT count(*) FROM pg_namespace WHERE nspname = 'pgque') \
                      + (SELECT count(*) FROM pg_extension WHERE extname = 'pgque')",
                &[],
            )
            .unwrap()
            .get(0);
        assert_eq!(left, 0, "{name}: nothing of pgque is left");
    }
}
