//! Table-change capture: pgque.logutriga / sqltriga / jsontriga on real
//! tables. Where PgQ 3.5 is installed (PostgreSQL 15 here, setup.sh), every
//! case runs the same statements on two identical tables, one with PgQ's
//! trigger and one with pgque's, and the events must be the same, field by
//! field (the schema name aside). Every case also checks pgque's events
//! against literal expected values, so the test means something without PgQ.
use pgque_pg_test::postgres::Client;
use pgque_pg_test::*;

/// ev_type, ev_data, ev_extra1..4 of one event.
type Ev = [Option<String>; 6];

fn has_pgq(c: &mut Client) -> bool {
    c.query_one(
        "SELECT EXISTS (SELECT 1 FROM pg_available_extensions WHERE name = 'pgq')",
        &[],
    )
    .unwrap()
    .get(0)
}

fn pgque_events(c: &mut Client, queue: &str) -> Vec<Ev> {
    let qid: i32 = c
        .query_one(
            "SELECT queue_id FROM pgque.queue WHERE queue_name = $1",
            &[&queue],
        )
        .unwrap()
        .get(0);
    rows(
        c,
        &format!(
            "SELECT ev_type, ev_data, ev_extra1, ev_extra2, ev_extra3, ev_extra4 FROM pgque.event_{qid} ORDER BY ev_id"
        ),
    )
}

fn pgq_events(c: &mut Client, queue: &str) -> Vec<Ev> {
    let pfx: String = c
        .query_one(
            "SELECT queue_data_pfx FROM pgq.queue WHERE queue_name = $1",
            &[&queue],
        )
        .unwrap()
        .get(0);
    rows(
        c,
        &format!("SELECT ev_type, ev_data, ev_extra1, ev_extra2, ev_extra3, ev_extra4 FROM {pfx} ORDER BY ev_id"),
    )
}

fn rows(c: &mut Client, sql: &str) -> Vec<Ev> {
    c.query(sql, &[])
        .unwrap()
        .iter()
        .map(|r| std::array::from_fn(|i| r.get::<_, Option<String>>(i)))
        .collect()
}

/// The schema names differ between the two tables of a case: normalise them.
fn norm(evs: Vec<Ev>, schema: &str) -> Vec<Ev> {
    evs.into_iter()
        .map(|e| e.map(|f| f.map(|s| s.replace(schema, "S"))))
        .collect()
}

const TABLE: &str = "(id int PRIMARY KEY, name text, amount numeric, flag boolean, \
                      ts timestamptz, d date, big int8, tags text[], note text)";

/// The statements every default case runs (each table gets them).
const DML: &str = "\
INSERT INTO {T} VALUES (1, 'a b&c=d', 12.50, true, '2024-05-06 07:08:09.5+00', '2024-05-06', 9000000000, '{x,\"y z\"}', NULL);
INSERT INTO {T} VALUES (2, 'it''s', NULL, false, NULL, NULL, NULL, NULL, 'n');
UPDATE {T} SET name = 'é', note = NULL WHERE id = 1;
UPDATE {T} SET name = name WHERE id = 2;
DELETE FROM {T} WHERE id = 2;";

struct Case {
    func: &'static str,
    /// Trigger arguments after the queue name, as SQL literals.
    args: &'static str,
    /// BEFORE instead of AFTER.
    before: bool,
    dml: &'static str,
}

/// Runs one case: pgque's trigger (and PgQ's, when installed) on identical
/// tables; returns pgque's events, after checking they equal PgQ's.
fn run_case(c: &mut Client, n: usize, case: &Case, with_pgq: bool) -> Vec<Ev> {
    let sides: &[(&str, &str)] = if with_pgq {
        &[("pgque", "qside"), ("pgq", "pside")]
    } else {
        &[("pgque", "qside")]
    };
    let mut got = vec![];
    for (ext, schema) in sides {
        let schema = format!("{schema}{n}");
        let queue = format!("{ext}_case{n}");
        let when = if case.before { "BEFORE" } else { "AFTER" };
        let args = if case.args.is_empty() {
            format!("'{queue}'")
        } else {
            format!("'{queue}', {}", case.args)
        };
        c.batch_execute(&format!(
            "CREATE SCHEMA {schema}; CREATE TABLE {schema}.t {TABLE}; \
             SELECT {ext}.create_queue('{queue}'); \
             CREATE TRIGGER cap {when} INSERT OR UPDATE OR DELETE ON {schema}.t \
               FOR EACH ROW EXECUTE PROCEDURE {ext}.{func}({args});",
            func = case.func
        ))
        .unwrap();
        c.batch_execute(&case.dml.replace("{T}", &format!("{schema}.t")))
            .unwrap_or_else(|e| panic!("case {n} on {ext}: {e}"));
        let evs = if *ext == "pgque" {
            pgque_events(c, &queue)
        } else {
            pgq_events(c, &queue)
        };
        got.push(norm(evs, &schema));
    }
    if with_pgq {
        assert_eq!(
            got[0], got[1],
            "case {n} ({} {}): pgque's events (left) differ from PgQ's (right)",
            case.func, case.args
        );
    }
    got.swap_remove(0)
}

fn s(v: &str) -> Option<String> {
    Some(v.to_string())
}

#[test]
fn triggers_publish_pgq_events_in_the_same_transaction() {
    let db = TestDb::new("triggers");
    let mut c = db.connect();
    stop_worker(&mut c);
    let with_pgq = has_pgq(&mut c);
    if with_pgq {
        c.batch_execute("CREATE EXTENSION pgq").unwrap();
    } else {
        eprintln!("PgQ is not installed for PostgreSQL {}: pgque's events are checked against literals only", major());
    }
    c.batch_execute("SET TimeZone = 'UTC'; SET DateStyle = 'ISO, MDY'")
        .unwrap();

    // logutriga, defaults.
    let evs = run_case(
        &mut c,
        1,
        &Case {
            func: "logutriga",
            args: "",
            before: false,
            dml: DML,
        },
        with_pgq,
    );
    assert_eq!(evs.len(), 5, "{evs:?}");
    assert_eq!(evs[0][0], s("I:id"));
    assert_eq!(
        evs[0][1],
        s("id=1&name=a+b%26c%3dd&amount=12.50&flag=t&ts=2024-05-06+07%3a08%3a09.5%2b00&d=2024-05-06&big=9000000000&tags=%7bx%2c%22y+z%22%7d&note")
    );
    assert_eq!(evs[0][2], s("S.t"));
    assert_eq!(evs[0][3], None);
    assert_eq!(evs[2][0], s("U:id"));
    assert_eq!(evs[3][0], s("U:id"), "a no-op UPDATE is published");
    assert_eq!(evs[4][0], s("D:id"));
    assert_eq!(
        evs[4][1]
            .as_deref()
            .map(|d| d.starts_with("id=2&name=it%27s")),
        Some(true)
    );

    // sqltriga, defaults.
    let evs = run_case(
        &mut c,
        2,
        &Case {
            func: "sqltriga",
            args: "",
            before: false,
            dml: DML,
        },
        with_pgq,
    );
    assert_eq!(evs.len(), 5, "{evs:?}");
    assert_eq!(evs[0][0], s("I"));
    assert_eq!(
        evs[1][1],
        s("(id,name,amount,flag,ts,d,big,tags,note) values ('2','it''s',null,'f',null,null,null,null,'n')")
    );
    assert_eq!(
        evs[2][1],
        s("name='é' where id='1'"),
        "only changed columns are set"
    );
    assert_eq!(
        evs[3][1],
        s("id='2' where id='2'"),
        "no-op UPDATE: the key set to itself"
    );
    assert_eq!(evs[4], [s("D"), s("id='2'"), s("S.t"), None, None, None]);

    // jsontriga, defaults.
    let evs = run_case(
        &mut c,
        3,
        &Case {
            func: "jsontriga",
            args: "",
            before: false,
            dml: DML,
        },
        with_pgq,
    );
    assert_eq!(evs.len(), 5, "{evs:?}");
    assert_eq!(
        evs[0][0],
        s(r#"{"op":"INSERT","table":["S","t"],"pkey":["id"]}"#)
    );
    assert_eq!(
        evs[0][1],
        s(
            r#"{"id":1,"name":"a b&c=d","amount":"12.50","flag":true,"ts":"2024-05-06T07:08:09.5+00:00","d":"2024-05-06","big":9000000000,"tags":"{x,\"y z\"}","note":null}"#
        )
    );
    assert_eq!(
        evs[4][0],
        s(r#"{"op":"DELETE","table":["S","t"],"pkey":["id"]}"#)
    );

    // backup, ignore=, pkey=, an override expression and when=.
    let opts_dml = "\
INSERT INTO {T} VALUES (1, 'a', 5, true, NULL, NULL, NULL, NULL, 'x');
INSERT INTO {T} VALUES (2, 'b', 50, true, NULL, NULL, NULL, NULL, 'y');
UPDATE {T} SET note = 'changed' WHERE id = 1;
UPDATE {T} SET amount = 60, note = 'z' WHERE id = 2;
DELETE FROM {T} WHERE id = 1;";
    for (n, func) in [(4, "logutriga"), (5, "sqltriga"), (6, "jsontriga")] {
        let evs = run_case(
            &mut c,
            n,
            &Case {
                func,
                args: "'backup', 'ignore=note', 'ev_extra4=upper(name)'",
                before: false,
                dml: opts_dml,
            },
            with_pgq,
        );
        // The UPDATE of the ignored column alone publishes nothing.
        assert_eq!(evs.len(), 4, "{func}: {evs:?}");
        assert_eq!(evs[0][5], s("A"), "{func}: ev_extra4=upper(name)");
        assert!(
            evs[2][3].is_some(),
            "{func}: backup of the old row in ev_extra2"
        );
        if func == "logutriga" {
            assert_eq!(evs[2][1], s("id=2&name=b&amount=60&flag=t&ts&d&big&tags"));
            assert_eq!(evs[2][3], s("id=2&name=b&amount=50&flag=t&ts&d&big&tags"));
        }
    }
    let evs = run_case(
        &mut c,
        7,
        &Case {
            func: "logutriga",
            args: "'pkey=name', 'when=amount > 10'",
            before: false,
            dml: opts_dml,
        },
        with_pgq,
    );
    assert_eq!(
        evs.iter().map(|e| e[0].clone()).collect::<Vec<_>>(),
        vec![s("I:name"), s("U:name")]
    );

    // SKIP in a BEFORE trigger: the event is published, the row is not written.
    let skip_dml = "INSERT INTO {T} VALUES (1, 'a', 1, true, NULL, NULL, NULL, NULL, NULL);";
    let evs = run_case(
        &mut c,
        8,
        &Case {
            func: "logutriga",
            args: "'SKIP'",
            before: true,
            dml: skip_dml,
        },
        with_pgq,
    );
    assert_eq!(evs.len(), 1);
    let rows: i64 = c
        .query_one("SELECT count(*) FROM qside8.t", &[])
        .unwrap()
        .get(0);
    assert_eq!(rows, 0, "SKIP drops the row change");
    // Without SKIP a BEFORE trigger lets the row through.
    let evs = run_case(
        &mut c,
        9,
        &Case {
            func: "jsontriga",
            args: "",
            before: true,
            dml: DML,
        },
        with_pgq,
    );
    assert_eq!(evs.len(), 5);
    let rows: i64 = c
        .query_one("SELECT count(*) FROM qside9.t", &[])
        .unwrap()
        .get(0);
    assert_eq!(rows, 1);

    // Magic columns set the fields; they are left out of the data.
    c.batch_execute(
        "CREATE TABLE magic (id int PRIMARY KEY, v text, _pgq_ev_type text, _pgq_ev_extra3 text); \
         SELECT pgque.create_queue('magicq'); \
         CREATE TRIGGER cap AFTER INSERT ON magic FOR EACH ROW EXECUTE PROCEDURE pgque.logutriga('magicq'); \
         INSERT INTO magic VALUES (1, 'x', 'custom', 'three');",
    )
    .unwrap();
    assert_eq!(
        pgque_events(&mut c, "magicq"),
        vec![[
            s("custom"),
            s("id=1&v=x"),
            s("public.magic"),
            None,
            s("three"),
            None
        ]]
    );

    // TRUNCATE: a statement trigger publishes one event.
    c.batch_execute(
        "CREATE TABLE tr (id int PRIMARY KEY); SELECT pgque.create_queue('trq'); \
         CREATE TRIGGER cap AFTER TRUNCATE ON tr FOR EACH STATEMENT EXECUTE PROCEDURE pgque.sqltriga('trq'); \
         TRUNCATE tr;",
    )
    .unwrap();
    assert_eq!(
        pgque_events(&mut c, "trq"),
        vec![[s("R"), s(""), s("public.tr"), None, None, None]]
    );
}

#[test]
fn events_commit_and_roll_back_with_the_row_change() {
    let db = TestDb::new("triggers_tx");
    let mut c = db.connect();
    c.batch_execute(
        "SELECT pgque.create_queue('outbox'); SELECT pgque.subscribe('outbox', 'c'); \
         CREATE TABLE orders (id int PRIMARY KEY, total numeric); \
         CREATE TRIGGER outbox AFTER INSERT OR UPDATE OR DELETE ON orders \
           FOR EACH ROW EXECUTE PROCEDURE pgque.jsontriga('outbox');",
    )
    .unwrap();
    c.batch_execute("BEGIN; INSERT INTO orders VALUES (1, 10); ROLLBACK;")
        .unwrap();
    c.batch_execute("BEGIN; INSERT INTO orders VALUES (2, 20); COMMIT;")
        .unwrap();
    c.batch_execute("SELECT pgque.force_tick('outbox')")
        .unwrap();
    let got = wait_until(std::time::Duration::from_secs(10), || {
        !c.query(
            "SELECT 1 FROM pgque.receive('outbox', 'c', 10) LIMIT 1",
            &[],
        )
        .unwrap()
        .is_empty()
    });
    assert!(got, "the committed change is delivered");
    let msgs = c
        .query(
            "SELECT type, payload, extra1 FROM pgque.receive('outbox', 'c', 10)",
            &[],
        )
        .unwrap();
    assert_eq!(msgs.len(), 1, "the rolled-back insert published nothing");
    assert_eq!(msgs[0].get::<_, String>(1), r#"{"id":2,"total":"20"}"#);
    assert_eq!(msgs[0].get::<_, String>(2), "public.orders");
}

#[test]
fn bad_trigger_arguments_and_changes_are_refused_clearly() {
    let db = TestDb::new("triggers_bad");
    let mut c = db.connect();
    stop_worker(&mut c);
    c.batch_execute(
        "SELECT pgque.create_queue('q'); \
         CREATE TABLE t (id int PRIMARY KEY, v text); CREATE TABLE nopk (v text); \
         INSERT INTO t VALUES (1, 'a'); INSERT INTO nopk VALUES ('a');",
    )
    .unwrap();
    let trig = |c: &mut Client, table: &str, when: &str, args: &str| {
        c.batch_execute(&format!(
            "DROP TRIGGER IF EXISTS cap ON {table}; \
             CREATE TRIGGER cap {when} INSERT OR UPDATE OR DELETE ON {table} \
               FOR EACH ROW EXECUTE PROCEDURE pgque.logutriga({args})"
        ))
        .unwrap();
    };
    let cases: &[(&str, &str, &str, &str, &str)] = &[
        ("t", "AFTER", "", "INSERT INTO t VALUES (2, 'b')", "22023"),
        (
            "t",
            "AFTER",
            "'q', 'bogus'",
            "INSERT INTO t VALUES (2, 'b')",
            "22023",
        ),
        (
            "t",
            "AFTER",
            "'q', 'skip'",
            "INSERT INTO t VALUES (2, 'b')",
            "22023",
        ),
        (
            "t",
            "AFTER",
            "'q', 'SKIP'",
            "INSERT INTO t VALUES (2, 'b')",
            "22023",
        ),
        (
            "t",
            "AFTER",
            "'nope'",
            "INSERT INTO t VALUES (2, 'b')",
            "42704",
        ),
        (
            "t",
            "AFTER",
            "'q'",
            "UPDATE t SET id = 5 WHERE id = 1",
            "0A000",
        ),
        (
            "t",
            "AFTER",
            "'q', 'when=v'",
            "INSERT INTO t VALUES (2, 'b')",
            "22023",
        ),
        (
            "t",
            "AFTER",
            "'q', 'when=NULL::boolean'",
            "INSERT INTO t VALUES (2, 'b')",
            "22004",
        ),
        (
            "t",
            "AFTER",
            "'q', 'when=no_such_column'",
            "INSERT INTO t VALUES (2, 'b')",
            "42703",
        ),
        (
            "t",
            "AFTER",
            "'q', 'deny'",
            "INSERT INTO t VALUES (2, 'b')",
            "55000",
        ),
        ("nopk", "AFTER", "'q'", "UPDATE nopk SET v = 'b'", "55000"),
        ("nopk", "AFTER", "'q'", "DELETE FROM nopk", "55000"),
    ];
    for (table, when, args, dml, want) in cases {
        trig(&mut c, table, when, args);
        let got = sqlstate(c.batch_execute(dml));
        assert_eq!(&got, want, "{table} {when} logutriga({args}): {dml}");
    }
    // Nothing was published or changed by the refused statements.
    let evs: i64 = c
        .query_one("SELECT count(*) FROM pgque.event_1", &[])
        .unwrap()
        .get(0);
    assert_eq!(evs, 0);
    let t: Vec<(i32, String)> = c
        .query("SELECT id, v FROM t ORDER BY id", &[])
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    assert_eq!(t, vec![(1, "a".to_string())]);
    // A statement-level INSERT trigger is refused at its first firing.
    c.batch_execute(
        "DROP TRIGGER cap ON t; CREATE TRIGGER cap AFTER INSERT ON t \
         FOR EACH STATEMENT EXECUTE PROCEDURE pgque.logutriga('q')",
    )
    .unwrap();
    assert_eq!(
        sqlstate(c.batch_execute("INSERT INTO t VALUES (3, 'c')")),
        "22023"
    );
}
