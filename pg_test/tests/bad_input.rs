//! The bad-input matrix: every public pgque function called with NULLs,
//! empty strings, over-long names, names with quotes, semicolons, spaces,
//! unicode and SQL fragments, wrong types, out-of-range numbers and unknown
//! queues / consumers / batches / jobs. Each call must fail with its
//! documented SQLSTATE (docs/errors.md) and change nothing: the row count of
//! every pgque table is the same before and after, and no object named like
//! the SQL fragments appears. The functions are enumerated from pg_proc: a
//! function without a row here fails the test, so new functions must be
//! added to the matrix.
use pgque_pg_test::postgres::fallible_iterator::FallibleIterator;
use pgque_pg_test::postgres::Client;
use pgque_pg_test::*;
use std::collections::{BTreeMap, BTreeSet};

/// What a call must do.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Expect {
    /// Fail with this SQLSTATE.
    St(&'static str),
    /// Accepted and changes nothing: the documented no-op of a lease-fenced
    /// job call (a stale or unknown (job, lease token) pair), PgQue's 0 of an
    /// ack of a finished batch or an unsubscribe of a non-subscriber.
    Noop,
    /// Accepted and may add rows: a valid call with a documented side
    /// effect (receive_coop registers an unknown member, as PgQue's does).
    Creates,
}
use Expect::{Creates, Noop, St};

/// An infinite interval: refused by pgque (22023) where PostgreSQL has them
/// (17+); before 17 the input itself is invalid (22007).
fn inf_interval() -> Expect {
    if major() >= 17 {
        St("22023")
    } else {
        St("22007")
    }
}

/// A name argument of a template, and what an unknown-but-valid name gives.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Slot {
    /// An existing event queue ('q').
    Queue,
    /// A subscribed plain consumer of 'q' ('c').
    Consumer,
    /// A member of the cooperative consumer 'grp' ('m1').
    Member,
    /// A cooperative consumer ('grp').
    Group,
    /// An existing job queue ('jq').
    JobQueue,
    /// An existing schedule ('sch', of job queue 'jq').
    Schedule,
}

impl Slot {
    fn tag(self) -> &'static str {
        match self {
            Slot::Queue => "{Q}",
            Slot::Consumer => "{C}",
            Slot::Member => "{M}",
            Slot::Group => "{G}",
            Slot::JobQueue => "{J}",
            Slot::Schedule => "{S}",
        }
    }
    fn valid(self) -> &'static str {
        match self {
            Slot::Queue => "'q'",
            Slot::Consumer => "'c'",
            Slot::Member => "'m1'",
            Slot::Group => "'grp'",
            Slot::JobQueue => "'jq'",
            Slot::Schedule => "'sch'",
        }
    }
    /// Longest accepted name (docs/errors.md): PgQue's 57 bytes for queue
    /// names (the NOTIFY channel pgque_<name> must fit 63 bytes).
    fn max_len(self) -> usize {
        match self {
            Slot::Queue | Slot::JobQueue => 57,
            _ => 200,
        }
    }
}

/// Hostile or malformed values for a name slot, with the SQLSTATE each
/// must give where the name must name an existing object.
fn name_cases(slot: Slot) -> Vec<(String, String, Expect)> {
    name_cases_unknown(slot, St("42704"))
}

/// `name_cases`, with what a valid but unknown name gives.
fn name_cases_unknown(slot: Slot, unknown: Expect) -> Vec<(String, String, Expect)> {
    let long = "a".repeat(slot.max_len() + 1);
    let long_uni = "ж".repeat(slot.max_len() / 2 + 1);
    let mut v = vec![
        ("NULL".into(), "NULL".into(), St("22004")),
        ("empty".into(), "''".into(), St("42602")),
        (
            format!("{} bytes", long.len()),
            format!("'{long}'"),
            St("42622"),
        ),
        (
            format!("{} bytes of unicode", long_uni.len()),
            format!("'{long_uni}'"),
            St("42622"),
        ),
        ("newline".into(), "E'a\\nb'".into(), St("42602")),
        ("tab".into(), "E'a\\tb'".into(), St("42602")),
        ("NUL-free control".into(), "E'a\\x01b'".into(), St("42602")),
        ("DEL".into(), "E'a\\x7fb'".into(), St("42602")),
        ("bidi override".into(), "E'ab\\u202Ecd'".into(), St("42602")),
        ("bidi isolate".into(), "E'a\\u2066b'".into(), St("42602")),
        // A call that registers the unknown name gets names of its own, so
        // later rows still find 'nope' unknown.
        (
            "unknown".into(),
            if unknown == Creates {
                "'nope_new'"
            } else {
                "'nope'"
            }
            .into(),
            unknown,
        ),
        (
            "unknown unicode".into(),
            if unknown == Creates {
                "'новый_член'"
            } else {
                "'очередь_нет'"
            }
            .into(),
            unknown,
        ),
    ];
    // Printable text is a name (as in PgQue): spaces, quotes, SQL fragments
    // and emoji are data, so they give what any valid unknown name gives,
    // and the `pwned objects` count shows they ran as nothing but data. A
    // call that creates the name gets it with a suffix, so later rows still
    // find the plain one unknown. The names start with "no such" so that
    // the objects the single-function rows below create (a queue 'a b', a
    // consumer 'x''y') are not found by these.
    let sfx = if unknown == Creates { "_new" } else { "" };
    for (label, name) in [
        ("space", "a b"),
        ("single quote", "x''y"),
        ("double quote", "x\"y"),
        ("semicolon", "q;"),
        ("SQL fragment", "q''); CREATE TABLE pwned_t (i int); --"),
        ("SQL fragment 2", "\"; CREATE ROLE pwned_r; --"),
        ("SQL fragment 3", "q;DROP/**/SCHEMA/**/pgque/**/CASCADE"),
        ("emoji", "🚀"),
    ] {
        v.push((label.into(), format!("'no such {name}{sfx}'"), unknown));
    }
    if matches!(slot, Slot::Queue | Slot::JobQueue) {
        // Past NAMEDATALEN: would not even fit a NOTIFY channel or identifier.
        v.push((
            "64 bytes".into(),
            format!("'{}'", "b".repeat(64)),
            St("42622"),
        ));
    }
    if matches!(slot, Slot::Consumer | Slot::Group) {
        // '#' separates slot and member names: refused in plain consumer names.
        v.push(("hash".into(), "'a#b'".into(), St("42602")));
    }
    v
}

struct Row {
    sig: &'static str,
    /// A call with every name slot valid; `slots` say which tags to vary.
    template: &'static str,
    slots: &'static [Slot],
    /// Hand-written cases: (label, SQL, expectation).
    extra: Vec<(&'static str, String, Expect)>,
    /// A function without arguments (or whose only arguments are covered
    /// elsewhere): why there is no bad input to give it.
    none: Option<&'static str>,
    /// What an unknown (valid) consumer / member name gives, where that is
    /// not 42704 (PgQue's contract: 0, or a registration).
    unknown_member: Option<Expect>,
}

fn row(sig: &'static str, template: &'static str, slots: &'static [Slot]) -> Row {
    Row {
        sig,
        template,
        slots,
        extra: vec![],
        none: None,
        unknown_member: None,
    }
}

fn no_args(sig: &'static str, why: &'static str) -> Row {
    Row {
        sig,
        template: "",
        slots: &[],
        extra: vec![],
        none: Some(why),
        unknown_member: None,
    }
}

impl Row {
    fn with(mut self, label: &'static str, sql: impl Into<String>, e: Expect) -> Row {
        self.extra.push((label, sql.into(), e));
        self
    }
    fn unknown_member(mut self, e: Expect) -> Row {
        self.unknown_member = Some(e);
        self
    }
}

use Slot::*;

/// Batch ids of the fixture (set in `fixture`), substituted for {B} (open
/// batch of consumer c), {BD} (a finished batch), {BM} (m1's open batch).
struct Ids {
    open: i64,
    done: i64,
    member_open: i64,
}

fn matrix() -> Vec<Row> {
    const QC: &[Slot] = &[Queue, Consumer];
    const Q: &[Slot] = &[Queue];
    const QGM: &[Slot] = &[Queue, Group, Member];
    const J: &[Slot] = &[JobQueue];
    let bad_json = St("22P02");
    // ack / finish_batch of an unknown or finished batch return 0 (PgQue).
    let finish_cases = |r: Row, call: &'static str| -> Row {
        r.with(
            "NULL batch",
            call.replace("{X}", "NULL::bigint"),
            St("22004"),
        )
        .with("unknown batch", call.replace("{X}", "987654321"), Noop)
        .with("negative batch", call.replace("{X}", "-1"), Noop)
        .with("finished batch", call.replace("{X}", "{BD}"), Noop)
        .with(
            "batch id as text",
            call.replace("{X}", "'one'"),
            St("22P02"),
        )
        .with(
            "batch id beyond bigint",
            call.replace("{X}", "'99999999999999999999'"),
            St("22003"),
        )
    };
    let batch_cases = |r: Row, call: &'static str| -> Row {
        // call has {X} where the batch id goes.
        r.with(
            "NULL batch",
            call.replace("{X}", "NULL::bigint"),
            St("22004"),
        )
        .with(
            "unknown batch",
            call.replace("{X}", "987654321"),
            St("42704"),
        )
        .with("negative batch", call.replace("{X}", "-1"), St("42704"))
        .with("finished batch", call.replace("{X}", "{BD}"), St("55000"))
        .with(
            "batch id as text",
            call.replace("{X}", "'one'"),
            St("22P02"),
        )
        .with(
            "batch id beyond bigint",
            call.replace("{X}", "'99999999999999999999'"),
            St("22003"),
        )
    };
    vec![
        // ---- publishing ------------------------------------------------------
        row("pgque.send(text,jsonb)", "SELECT pgque.send({Q}::text, '{}'::jsonb)", Q)
            .with("not JSON", "SELECT pgque.send('q', '{nope'::jsonb)", bad_json),
        row("pgque.send(text,text)", "SELECT pgque.send({Q}::text, 'x'::text)", Q),
        row(
            "pgque.send(text,text,jsonb)",
            "SELECT pgque.send({Q}::text, 't'::text, '{}'::jsonb)",
            Q,
        )
        .with("NULL type", "SELECT pgque.send('q', NULL::text, '{}'::jsonb)", St("22004"))
        .with("empty type", "SELECT pgque.send('q', '', '{}'::jsonb)", St("42602"))
        .with("not JSON", "SELECT pgque.send('q', 't', '[1,'::jsonb)", bad_json),
        row(
            "pgque.send(text,text,text)",
            "SELECT pgque.send({Q}::text, 't'::text, 'x'::text)",
            Q,
        )
        .with("NULL type", "SELECT pgque.send('q', NULL::text, 'x'::text)", St("22004"))
        .with("empty type", "SELECT pgque.send('q', ''::text, 'x'::text)", St("42602")),
        row(
            "pgque.send_batch(text,jsonb[])",
            "SELECT pgque.send_batch({Q}::text, ARRAY['{}']::jsonb[])",
            Q,
        )
        .with("NULL array", "SELECT pgque.send_batch('q', NULL::jsonb[])", St("22004"))
        .with("not JSON element", "SELECT pgque.send_batch('q', ARRAY['{', '1']::jsonb[])", bad_json),
        row(
            "pgque.send_batch(text,text[])",
            "SELECT pgque.send_batch({Q}::text, ARRAY['x']::text[])",
            Q,
        )
        .with("NULL array", "SELECT pgque.send_batch('q', NULL::text[])", St("22004")),
        row(
            "pgque.send_batch(text,text,jsonb[])",
            "SELECT pgque.send_batch({Q}::text, 't'::text, ARRAY['{}']::jsonb[])",
            Q,
        )
        .with("NULL type", "SELECT pgque.send_batch('q', NULL::text, ARRAY['1']::jsonb[])", St("22004"))
        .with("empty type", "SELECT pgque.send_batch('q', '', ARRAY['1']::jsonb[])", St("42602"))
        .with("NULL array", "SELECT pgque.send_batch('q', 't', NULL::jsonb[])", St("22004")),
        row(
            "pgque.send_batch(text,text,text[])",
            "SELECT pgque.send_batch({Q}::text, 't'::text, ARRAY['x']::text[])",
            Q,
        )
        .with("NULL type", "SELECT pgque.send_batch('q', NULL::text, ARRAY['x']::text[])", St("22004"))
        .with("empty type", "SELECT pgque.send_batch('q', ''::text, ARRAY['x']::text[])", St("42602"))
        .with("NULL array", "SELECT pgque.send_batch('q', 't'::text, NULL::text[])", St("22004")),
        row(
            "pgque.insert_event(text,text,text)",
            "SELECT pgque.insert_event({Q}::text, 't', 'x')",
            Q,
        ),
        row(
            "pgque.insert_event(text,text,text,text,text,text,text)",
            "SELECT pgque.insert_event({Q}::text, 't', 'x', 'a', 'b', 'c', 'd')",
            Q,
        )
        .with("extra1 (the partition key) over 1 kB", format!("SELECT pgque.insert_event('q', 't', 'x', '{}', NULL, NULL, NULL)", "k".repeat(1025)), St("54000")),
        row(
            "pgque.send_idem(text,text,jsonb,text,interval,text,jsonb)",
            "SELECT * FROM pgque.send_idem({Q}::text, 't', '{}'::jsonb, 'k1')",
            Q,
        )
        .with("NULL key", "SELECT * FROM pgque.send_idem('q', 't', '{}'::jsonb, NULL)", St("22004"))
        .with("empty key", "SELECT * FROM pgque.send_idem('q', 't', '{}'::jsonb, '')", St("22023"))
        .with("zero TTL", "SELECT * FROM pgque.send_idem('q', 't', '{}'::jsonb, 'k', '0')", St("22023"))
        .with("negative TTL", "SELECT * FROM pgque.send_idem('q', 't', '{}'::jsonb, 'k', '-1 hour')", St("22023"))
        .with("infinite TTL", "SELECT * FROM pgque.send_idem('q', 't', '{}'::jsonb, 'k', 'infinity')", inf_interval())
        .with("NULL TTL", "SELECT * FROM pgque.send_idem('q', 't', '{}'::jsonb, 'k', NULL)", St("22004"))
        .with("TTL not an interval", "SELECT * FROM pgque.send_idem('q', 't', '{}'::jsonb, 'k', 'soon')", St("22007"))
        .with("not JSON", "SELECT * FROM pgque.send_idem('q', 't', '{'::jsonb, 'k')", bad_json)
        .with("headers not an object", "SELECT * FROM pgque.send_idem('q', 't', '{}'::jsonb, 'k', headers => '[]')", St("22023"))
        .with("headers over 1 kB", format!("SELECT * FROM pgque.send_idem('q', 't', '{{}}'::jsonb, 'k', headers => '{{\"tracestate\": \"{}\"}}')", "x".repeat(1100)), St("54000")),
        row(
            "pgque.send_idem(text,text,text,text,interval,text,jsonb)",
            "SELECT * FROM pgque.send_idem({Q}::text, 't', 'x'::text, 'k1')",
            Q,
        )
        .with("NULL key", "SELECT * FROM pgque.send_idem('q', 't', 'x'::text, NULL)", St("22004"))
        .with("zero TTL", "SELECT * FROM pgque.send_idem('q', 't', 'x'::text, 'k', '0')", St("22023"))
        .with("infinite TTL", "SELECT * FROM pgque.send_idem('q', 't', 'x'::text, 'k', 'infinity')", inf_interval())
        .with("headers value not a string", "SELECT * FROM pgque.send_idem('q', 't', 'x'::text, 'k', headers => '{\"a\": 1}')", St("22023"))
        .with("partition key over 1 kB", format!("SELECT * FROM pgque.send_idem('q', 't', 'x'::text, 'k', '1 hour', '{}')", "k".repeat(1025)), St("54000")),
        row(
            "pgque.send_at(text,text,jsonb,timestamp with time zone,text,jsonb)",
            "SELECT pgque.send_at({Q}::text, 't', '{}'::jsonb, now() + interval '1 hour')",
            Q,
        )
        .with("NULL time", "SELECT pgque.send_at('q', 't', '{}'::jsonb, NULL)", St("22004"))
        .with("infinite time", "SELECT pgque.send_at('q', 't', '{}'::jsonb, 'infinity')", St("22023"))
        .with("-infinity", "SELECT pgque.send_at('q', 't', '{}'::jsonb, '-infinity')", St("22023"))
        .with("not a time", "SELECT pgque.send_at('q', 't', '{}'::jsonb, 'tomorrow-ish')", St("22007"))
        .with("not JSON", "SELECT pgque.send_at('q', 't', 'x'::jsonb, now())", bad_json)
        .with("headers not an object", "SELECT pgque.send_at('q', 't', '{}'::jsonb, now() + interval '1 hour', headers => '1')", St("22023")),
        row(
            "pgque.send_at(text,text,text,timestamp with time zone,text,jsonb)",
            "SELECT pgque.send_at({Q}::text, 't', 'x'::text, now() + interval '1 hour')",
            Q,
        )
        .with("NULL time", "SELECT pgque.send_at('q', 't', 'x'::text, NULL)", St("22004"))
        .with("infinite time", "SELECT pgque.send_at('q', 't', 'x'::text, 'infinity')", St("22023"))
        .with("headers over 1 kB", format!("SELECT pgque.send_at('q', 't', 'x'::text, now(), headers => '{{\"tracestate\": \"{}\"}}')", "x".repeat(1100)), St("54000"))
        .with("partition key over 1 kB", format!("SELECT pgque.send_at('q', 't', 'x'::text, now() + interval '1 hour', '{}')", "k".repeat(1025)), St("54000")),
        // ---- consumers -------------------------------------------------------
        row("pgque.subscribe(text,text)", "SELECT pgque.subscribe({Q}::text, 'newc')", Q)
            .with("NULL consumer", "SELECT pgque.subscribe('q', NULL)", St("22004"))
            .with("empty consumer", "SELECT pgque.subscribe('q', '')", St("42602"))
            .with("hash in consumer", "SELECT pgque.subscribe('q', 'a#b')", St("42602"))
            .with("SQL in consumer", "SELECT pgque.subscribe('q', 'c''); CREATE TABLE pwned_s (i int); --')", Creates)
            .with("long consumer", format!("SELECT pgque.subscribe('q', '{}')", "c".repeat(201)), St("42622")),
        row("pgque.unsubscribe(text,text)", "SELECT pgque.unsubscribe({Q}::text, {C}::text)", QC)
            .unknown_member(Noop),
        row(
            "pgque.register_consumer(text,text)",
            "SELECT pgque.register_consumer({Q}::text, 'newc')",
            Q,
        )
        .with("NULL consumer", "SELECT pgque.register_consumer('q', NULL)", St("22004"))
        .with("space in consumer", "SELECT pgque.register_consumer('q', 'a b')", Creates)
        .with("newline in consumer", "SELECT pgque.register_consumer('q', E'a\\nb')", St("42602")),
        row(
            "pgque.register_consumer_at(text,text,bigint)",
            "SELECT pgque.register_consumer_at({Q}::text, 'newc', 1)",
            Q,
        )
        .with("NULL tick", "SELECT pgque.register_consumer_at('q', 'newc', NULL)", St("22004"))
        .with("unknown tick", "SELECT pgque.register_consumer_at('q', 'newc', 987654321)", St("42704"))
        .with("negative tick", "SELECT pgque.register_consumer_at('q', 'newc', -5)", St("42704")),
        row(
            "pgque.unregister_consumer(text,text)",
            "SELECT pgque.unregister_consumer({Q}::text, {C}::text)",
            QC,
        )
        .unknown_member(Noop),
        row(
            "pgque.receive(text,text,integer)",
            "SELECT * FROM pgque.receive({Q}::text, {C}::text, 10)",
            QC,
        )
        .with("zero", "SELECT * FROM pgque.receive('q', 'c', 0)", St("22023"))
        .with("negative", "SELECT * FROM pgque.receive('q', 'c', -1)", St("22023"))
        .with("NULL max", "SELECT * FROM pgque.receive('q', 'c', NULL)", St("22004"))
        .with("beyond int", "SELECT * FROM pgque.receive('q', 'c', '3000000000')", St("22003"))
        .with("text max", "SELECT * FROM pgque.receive('q', 'c', 'ten')", St("22P02"))
        .with("numeric max", "SELECT * FROM pgque.receive('q', 'c', 1.5)", St("42883"))
        .with("max beyond the cap, taken as the cap", "SELECT * FROM pgque.receive('q', 'c', 2147483647)", Creates),
        row(
            "pgque.receive(text,text,integer,interval)",
            "SELECT * FROM pgque.receive({Q}::text, {C}::text, 10, '0 s')",
            QC,
        )
        .with("zero", "SELECT * FROM pgque.receive('q', 'c', 0, '0 s')", St("22023"))
        .with("NULL max", "SELECT * FROM pgque.receive('q', 'c', NULL, '0 s')", St("22004"))
        .with("NULL wait", "SELECT * FROM pgque.receive('q', 'c', 10, NULL)", St("22004"))
        .with("negative wait", "SELECT * FROM pgque.receive('q', 'c', 10, '-1 s')", St("22023"))
        .with("infinite wait", "SELECT * FROM pgque.receive('q', 'c', 10, 'infinity')", inf_interval())
        .with("text wait", "SELECT * FROM pgque.receive('q', 'c', 10, 'soon')", St("22007")),
        row(
            "pgque.next_batch_wait(text,text,interval)",
            "SELECT pgque.next_batch_wait({Q}::text, {C}::text, '0 s')",
            QC,
        )
        .with("NULL wait", "SELECT pgque.next_batch_wait('q', 'c', NULL)", St("22004"))
        .with("negative wait", "SELECT pgque.next_batch_wait('q', 'c', '-1 s')", St("22023")),
        finish_cases(row("pgque.ack(bigint)", "", &[]), "SELECT pgque.ack({X})"),
        row("pgque.ack_receive(bigint,integer)", "", &[])
            .with("NULL batch", "SELECT * FROM pgque.ack_receive(NULL)", St("22004"))
            .with("unknown batch", "SELECT * FROM pgque.ack_receive(987654321)", St("42704"))
            .with("zero max", "SELECT * FROM pgque.ack_receive(1, 0)", St("22023"))
            .with("NULL max", "SELECT * FROM pgque.ack_receive(1, NULL)", St("22004")),
        finish_cases(row("pgque.finish_batch(bigint)", "", &[]), "SELECT pgque.finish_batch({X})"),
        batch_cases(
            row("pgque.nack(bigint,pgque.message,interval,text)", "", &[]),
            "SELECT pgque.nack({X}, (SELECT m FROM pgque.receive('q', 'c', 10) m LIMIT 1))",
        )
        .with("NULL msg", "SELECT pgque.nack({B}, NULL)", St("22004"))
        .with(
            "msg of another batch",
            "SELECT pgque.nack({B}, ROW(1, {BD}, 't', 'x', NULL, now(), NULL, NULL, NULL, NULL)::pgque.message)",
            St("22023"),
        )
        .with(
            "msg not in the batch",
            "SELECT pgque.nack({B}, ROW(987654321, {B}, 't', 'x', NULL, now(), NULL, NULL, NULL, NULL)::pgque.message)",
            St("42704"),
        )
        .with(
            "msg id NULL",
            "SELECT pgque.nack({B}, ROW(NULL, {B}, 't', 'x', NULL, now(), NULL, NULL, NULL, NULL)::pgque.message)",
            St("22004"),
        )
        .with(
            "negative retry_after",
            "SELECT pgque.nack({B}, (SELECT m FROM pgque.receive('q', 'c', 10) m LIMIT 1), '-1 minute')",
            St("22023"),
        )
        .with(
            "infinite retry_after",
            "SELECT pgque.nack({B}, (SELECT m FROM pgque.receive('q', 'c', 10) m LIMIT 1), 'infinity')",
            inf_interval(),
        )
        .with(
            "NULL retry_after",
            "SELECT pgque.nack({B}, (SELECT m FROM pgque.receive('q', 'c', 10) m LIMIT 1), NULL)",
            St("22004"),
        )
        .with("msg as text", "SELECT pgque.nack({B}, 'not a message')", St("22P02")),
        row("pgque.next_batch(text,text)", "SELECT pgque.next_batch({Q}::text, {C}::text)", QC),
        row(
            "pgque.next_batch_info(text,text)",
            "SELECT * FROM pgque.next_batch_info({Q}::text, {C}::text)",
            QC,
        ),
        row(
            "pgque.next_batch_custom(text,text,interval,integer,interval)",
            "SELECT * FROM pgque.next_batch_custom({Q}::text, {C}::text, NULL, NULL, NULL)",
            QC,
        )
        .with("negative lag", "SELECT * FROM pgque.next_batch_custom('q', 'c', '-1 s', NULL, NULL)", St("22023"))
        .with("negative count", "SELECT * FROM pgque.next_batch_custom('q', 'c', NULL, -1, NULL)", St("22023"))
        .with("negative interval", "SELECT * FROM pgque.next_batch_custom('q', 'c', NULL, NULL, '-1 s')", St("22023"))
        .with("infinite lag", "SELECT * FROM pgque.next_batch_custom('q', 'c', 'infinity', NULL, NULL)", inf_interval()),
        batch_cases(
            row("pgque.get_batch_events(bigint)", "", &[]),
            "SELECT * FROM pgque.get_batch_events({X})",
        ),
        batch_cases(
            row("pgque.get_batch_cursor(bigint,text,integer)", "", &[]),
            "SELECT * FROM pgque.get_batch_cursor({X}, 'cur', 1)",
        )
        .with("NULL cursor", "SELECT * FROM pgque.get_batch_cursor({B}, NULL, 1)", St("22004"))
        .with("empty cursor", "SELECT * FROM pgque.get_batch_cursor({B}, '', 1)", St("42602"))
        .with(
            "SQL in cursor name",
            "SELECT * FROM pgque.get_batch_cursor({B}, 'c FOR SELECT 1; CREATE TABLE pwned_c (i int); --', 1)",
            Noop,
        )
        .with("newline in cursor", "SELECT * FROM pgque.get_batch_cursor({B}, E'c\\nd', 1)", St("42602"))
        .with("long cursor name", format!("SELECT * FROM pgque.get_batch_cursor({{B}}, '{}', 1)", "c".repeat(64)), St("42622"))
        .with("NULL limit", "SELECT * FROM pgque.get_batch_cursor({B}, 'cur', NULL)", St("22004"))
        .with("negative limit", "SELECT * FROM pgque.get_batch_cursor({B}, 'cur', -1)", St("22023"))
        .with("limit beyond the cap", "SELECT * FROM pgque.get_batch_cursor({B}, 'cur', 100001)", St("54000")),
        batch_cases(
            row("pgque.event_retry(bigint,bigint,timestamp with time zone)", "", &[]),
            "SELECT pgque.event_retry({X}, 1, now())",
        )
        .with("NULL event", "SELECT pgque.event_retry({B}, NULL, now())", St("22004"))
        .with("unknown event", "SELECT pgque.event_retry({B}, 987654321, now())", St("42704"))
        .with("NULL time", "SELECT pgque.event_retry({B}, 1, NULL::timestamptz)", St("22004"))
        .with("infinite time", "SELECT pgque.event_retry({B}, 1, 'infinity'::timestamptz)", St("22023")),
        batch_cases(
            row("pgque.event_retry(bigint,bigint,integer)", "", &[]),
            "SELECT pgque.event_retry({X}, 1, 10)",
        )
        .with("NULL event", "SELECT pgque.event_retry({B}, NULL, 10)", St("22004"))
        .with("unknown event", "SELECT pgque.event_retry({B}, 987654321, 10)", St("42704"))
        .with("negative seconds", "SELECT pgque.event_retry({B}, 1, -10)", St("22023"))
        .with("NULL seconds", "SELECT pgque.event_retry({B}, 1, NULL::int)", St("22004")),
        batch_cases(
            row("pgque.batch_retry(bigint,integer)", "", &[]),
            "SELECT pgque.batch_retry({X}, 10)",
        )
        .with("negative seconds", "SELECT pgque.batch_retry({B}, -1)", St("22023"))
        .with("NULL seconds", "SELECT pgque.batch_retry({B}, NULL)", St("22004")),
        // ---- partition keys (fixture: 'pc' partitioned with n = 4, slot 0
        // claimed by 'w1'; slot 1 free) ---------------------------------------
        row(
            "pgque.send(text,text,jsonb,text)",
            "SELECT pgque.send({Q}::text, 't'::text, '{}'::jsonb, 'k'::text)",
            Q,
        )
        .with("NULL type", "SELECT pgque.send('q', NULL::text, '{}'::jsonb, 'k'::text)", St("22004"))
        .with("not JSON", "SELECT pgque.send('q', 't', '{x'::jsonb, 'k'::text)", bad_json),
        row(
            "pgque.send(text,text,text,text)",
            "SELECT pgque.send({Q}::text, 't'::text, 'x'::text, 'k'::text)",
            Q,
        )
        .with("empty type", "SELECT pgque.send('q', ''::text, 'x'::text, 'k'::text)", St("42602")),
        row(
            "pgque.send_batch(text,text,jsonb[],text[])",
            "SELECT pgque.send_batch({Q}::text, 't'::text, ARRAY['{}']::jsonb[], ARRAY['k'])",
            Q,
        )
        .with("NULL payloads", "SELECT pgque.send_batch('q', 't', NULL::jsonb[], ARRAY['k'])", St("22004"))
        .with("keys not aligned", "SELECT pgque.send_batch('q', 't', ARRAY['{}', '{}']::jsonb[], ARRAY['k'])", St("22023")),
        row(
            "pgque.send_batch(text,text,text[],text[])",
            "SELECT pgque.send_batch({Q}::text, 't'::text, ARRAY['x']::text[], ARRAY['k'])",
            Q,
        )
        .with("keys not aligned", "SELECT pgque.send_batch('q', 't', ARRAY['x']::text[], ARRAY['k', 'l'])", St("22023")),
        // ---- trace-context headers on events (docs/tracing.md) ----------------
        row(
            "pgque.send(text,text,jsonb,text,jsonb)",
            "SELECT pgque.send({Q}::text, 't'::text, '{}'::jsonb, 'k'::text, '{\"traceparent\": \"00-x\"}'::jsonb)",
            Q,
        )
        .with("NULL type", "SELECT pgque.send('q', NULL::text, '{}'::jsonb, 'k', '{}'::jsonb)", St("22004"))
        .with("headers not an object", "SELECT pgque.send('q', 't', '{}'::jsonb, 'k', '[\"00-x\"]'::jsonb)", St("22023"))
        .with("headers value not a string", "SELECT pgque.send('q', 't', '{}'::jsonb, NULL, '{\"traceparent\": 1}'::jsonb)", St("22023"))
        .with("headers over 1 kB", format!("SELECT pgque.send('q', 't', '{{}}'::jsonb, NULL, '{{\"tracestate\": \"{}\"}}'::jsonb)", "x".repeat(1100)), St("54000"))
        .with("headers not JSON", "SELECT pgque.send('q', 't', '{}'::jsonb, NULL, '{x'::jsonb)", bad_json)
        .with("partition key over 1 kB", format!("SELECT pgque.send('q', 't', '{{}}'::jsonb, '{}', NULL::jsonb)", "k".repeat(1025)), St("54000")),
        row(
            "pgque.send(text,text,text,text,jsonb)",
            "SELECT pgque.send({Q}::text, 't'::text, 'x'::text, 'k'::text, '{\"traceparent\": \"00-x\"}'::jsonb)",
            Q,
        )
        .with("empty type", "SELECT pgque.send('q', ''::text, 'x'::text, 'k', NULL::jsonb)", St("42602"))
        .with("headers a string", "SELECT pgque.send('q', 't', 'x'::text, 'k', '\"00-x\"'::jsonb)", St("22023")),
        row(
            "pgque.send_batch(text,text,jsonb[],text[],jsonb)",
            "SELECT pgque.send_batch({Q}::text, 't'::text, ARRAY['{}']::jsonb[], ARRAY['k'], '{\"traceparent\": \"00-x\"}'::jsonb)",
            Q,
        )
        .with("NULL payloads", "SELECT pgque.send_batch('q', 't', NULL::jsonb[], NULL, '{}'::jsonb)", St("22004"))
        .with("keys not aligned", "SELECT pgque.send_batch('q', 't', ARRAY['{}', '{}']::jsonb[], ARRAY['k'], NULL::jsonb)", St("22023"))
        .with("a partition key over 1 kB", format!("SELECT pgque.send_batch('q', 't', ARRAY['{{}}', '{{}}']::jsonb[], ARRAY['k', '{}'], NULL::jsonb)", "é".repeat(513)), St("54000"))
        .with("headers value null", "SELECT pgque.send_batch('q', 't', ARRAY['{}']::jsonb[], NULL, '{\"a\": null}'::jsonb)", St("22023")),
        row(
            "pgque.send_batch(text,text,text[],text[],jsonb)",
            "SELECT pgque.send_batch({Q}::text, 't'::text, ARRAY['x']::text[], NULL::text[], '{\"traceparent\": \"00-x\"}'::jsonb)",
            Q,
        )
        .with("headers over 1 kB", format!("SELECT pgque.send_batch('q', 't', ARRAY['x']::text[], NULL, '{{\"tracestate\": \"{}\"}}'::jsonb)", "x".repeat(1100)), St("54000")),
        row(
            "pgque.receive_with_headers(text,text,integer)",
            "SELECT * FROM pgque.receive_with_headers({Q}::text, {C}::text, 10)",
            QC,
        )
        .with("zero", "SELECT * FROM pgque.receive_with_headers('q', 'c', 0)", St("22023"))
        .with("NULL max", "SELECT * FROM pgque.receive_with_headers('q', 'c', NULL)", St("22004")),
        row(
            "pgque.receive_with_headers(text,text,integer,interval)",
            "SELECT * FROM pgque.receive_with_headers({Q}::text, {C}::text, 10, '0 s')",
            QC,
        )
        .with("zero", "SELECT * FROM pgque.receive_with_headers('q', 'c', 0, '0 s')", St("22023"))
        .with("NULL wait", "SELECT * FROM pgque.receive_with_headers('q', 'c', 10, NULL)", St("22004"))
        .with("negative wait", "SELECT * FROM pgque.receive_with_headers('q', 'c', 10, '-1 s')", St("22023")),
        row(
            "pgque.receive_partitioned_with_headers(text,text,integer,integer,text,integer)",
            "SELECT * FROM pgque.receive_partitioned_with_headers({Q}::text, {C}::text, 0, 4, 'w1')",
            QC,
        )
        .with("not the lease holder", "SELECT * FROM pgque.receive_partitioned_with_headers('q', 'pc', 0, 4, 'w2')", St("55000"))
        .with("different n", "SELECT * FROM pgque.receive_partitioned_with_headers('q', 'pc', 0, 8, 'w1')", St("22023"))
        .with("zero max_return", "SELECT * FROM pgque.receive_partitioned_with_headers('q', 'pc', 0, 4, 'w1', 0)", St("22023")),
        row(
            "pgque.subscribe_partitioned(text,text,integer)",
            "SELECT pgque.subscribe_partitioned({Q}::text, 'newpc', 4)",
            Q,
        )
        .with("NULL consumer", "SELECT pgque.subscribe_partitioned('q', NULL, 4)", St("22004"))
        .with("hash in consumer", "SELECT pgque.subscribe_partitioned('q', 'a#1', 4)", St("42602"))
        .with("n = 0", "SELECT pgque.subscribe_partitioned('q', 'newpc', 0)", St("22003"))
        .with("n = 257", "SELECT pgque.subscribe_partitioned('q', 'newpc', 257)", St("22003"))
        .with("NULL n", "SELECT pgque.subscribe_partitioned('q', 'newpc', NULL)", St("22004"))
        .with("different n", "SELECT pgque.subscribe_partitioned('q', 'pc', 8)", St("22023"))
        .with("name of a plain consumer", "SELECT pgque.subscribe_partitioned('q', 'c', 4)", St("42710")),
        row(
            "pgque.subscribe_partitioned(text,text,integer,text,text)",
            "SELECT pgque.subscribe_partitioned({Q}::text, 'newpp', 4, 'pause')",
            Q,
        )
        .with("NULL policy", "SELECT pgque.subscribe_partitioned('q', 'newpp', 4, NULL)", St("22004"))
        .with("unknown policy", "SELECT pgque.subscribe_partitioned('q', 'newpp', 4, 'halt')", St("22023"))
        .with("policy case", "SELECT pgque.subscribe_partitioned('q', 'newpp', 4, 'PAUSE')", St("22023"))
        .with("NULL on_dead_letter", "SELECT pgque.subscribe_partitioned('q', 'newpp', 4, 'pause', NULL)", St("22004"))
        .with("unknown on_dead_letter", "SELECT pgque.subscribe_partitioned('q', 'newpp', 4, 'pause', 'retry')", St("22023"))
        .with("block with skip", "SELECT pgque.subscribe_partitioned('q', 'newpp', 4, 'skip', 'block')", St("22023"))
        .with("other policy than persisted", "SELECT pgque.subscribe_partitioned('q', 'pc', 4, 'pause')", St("22023"))
        .with("hash in consumer", "SELECT pgque.subscribe_partitioned('q', 'a#1', 4, 'pause')", St("42602"))
        .with("n = 0", "SELECT pgque.subscribe_partitioned('q', 'newpp', 0, 'pause')", St("22003")),
        row(
            "pgque.release_partition_key(text,text,text)",
            "SELECT pgque.release_partition_key({Q}::text, {C}::text, 'k')",
            QC,
        )
        .with("NULL key", "SELECT pgque.release_partition_key('q', 'pc', NULL)", St("22004")),
        row(
            "pgque.begin_resize(text,text,integer)",
            "SELECT pgque.begin_resize({Q}::text, {C}::text, 8)",
            QC,
        )
        .with("NULL new_n", "SELECT pgque.begin_resize('q', 'pc', NULL)", St("22004"))
        .with("new_n = n", "SELECT pgque.begin_resize('q', 'pc', 4)", St("22023"))
        .with("new_n = 0", "SELECT pgque.begin_resize('q', 'pc', 0)", St("22003"))
        .with("new_n too big", "SELECT pgque.begin_resize('q', 'pc', 257)", St("22003"))
        .with("plain consumer", "SELECT pgque.begin_resize('q', 'c', 8)", St("42704"))
        .with("hash in consumer", "SELECT pgque.begin_resize('q', 'pc#1', 8)", St("42602")),
        row(
            "pgque.resize_ready(text,text)",
            "SELECT * FROM pgque.resize_ready({Q}::text, {C}::text)",
            QC,
        )
        .with("no resize", "SELECT * FROM pgque.resize_ready('q', 'pc')", St("55000")),
        row(
            "pgque.complete_resize(text,text)",
            "SELECT pgque.complete_resize({Q}::text, {C}::text)",
            QC,
        )
        .with("no resize", "SELECT pgque.complete_resize('q', 'pc')", St("55000"))
        .with("plain consumer", "SELECT pgque.complete_resize('q', 'c')", St("42704")),
        row(
            "pgque.abort_resize(text,text)",
            "SELECT pgque.abort_resize({Q}::text, {C}::text)",
            QC,
        )
        .with("no resize", "SELECT pgque.abort_resize('q', 'pc')", St("55000")),
        row(
            "pgque.unsubscribe_partitioned(text,text)",
            "SELECT pgque.unsubscribe_partitioned({Q}::text, {C}::text)",
            QC,
        ),
        row(
            "pgque.subscribe_slot(text,text,integer,integer)",
            "SELECT pgque.subscribe_slot({Q}::text, 'pc', 1, 4)",
            Q,
        )
        .with("slot = n", "SELECT pgque.subscribe_slot('q', 'pc', 4, 4)", St("22003"))
        .with("negative slot", "SELECT pgque.subscribe_slot('q', 'pc', -1, 4)", St("22003"))
        .with("different n", "SELECT pgque.subscribe_slot('q', 'pc', 1, 5)", St("22023")),
        row(
            "pgque.unsubscribe_slot(text,text,integer,integer)",
            "SELECT pgque.unsubscribe_slot({Q}::text, {C}::text, 1, 4)",
            QC,
        )
        .with("slot out of range", "SELECT pgque.unsubscribe_slot('q', 'pc', 9, 4)", St("22003")),
        row(
            "pgque.claim_slot(text,text,integer,text,interval)",
            "SELECT pgque.claim_slot({Q}::text, {C}::text, 1, 'w2')",
            QC,
        )
        .with("NULL worker", "SELECT pgque.claim_slot('q', 'pc', 1, NULL)", St("22004"))
        .with("empty worker", "SELECT pgque.claim_slot('q', 'pc', 1, '')", St("42602"))
        .with("slot out of range", "SELECT pgque.claim_slot('q', 'pc', 4, 'w2')", St("22003"))
        .with("zero ttl", "SELECT pgque.claim_slot('q', 'pc', 1, 'w2', interval '0')", St("22023"))
        .with("negative ttl", "SELECT pgque.claim_slot('q', 'pc', 1, 'w2', interval '-5 seconds')", St("22023"))
        .with("ttl under a second", "SELECT pgque.claim_slot('q', 'pc', 1, 'w2', interval '10 ms')", St("22023"))
        .with("infinite ttl", "SELECT pgque.claim_slot('q', 'pc', 1, 'w2', 'infinity'::interval)", inf_interval()),
        row(
            "pgque.claim_next_slot(text,text,text,interval)",
            "SELECT * FROM pgque.claim_next_slot({Q}::text, {C}::text, 'w2')",
            QC,
        )
        .with("NULL worker", "SELECT * FROM pgque.claim_next_slot('q', 'pc', NULL)", St("22004"))
        .with("zero ttl", "SELECT * FROM pgque.claim_next_slot('q', 'pc', 'w2', interval '0')", St("22023")),
        row(
            "pgque.release_slot(text,text,integer,text)",
            "SELECT pgque.release_slot({Q}::text, {C}::text, 0, 'w1')",
            QC,
        )
        .with("NULL worker", "SELECT pgque.release_slot('q', 'pc', 0, NULL)", St("22004"))
        .with("slot out of range", "SELECT pgque.release_slot('q', 'pc', 7, 'w1')", St("22003")),
        row(
            "pgque.receive_partitioned(text,text,integer,integer,text,integer)",
            "SELECT * FROM pgque.receive_partitioned({Q}::text, {C}::text, 0, 4, 'w1')",
            QC,
        )
        .with("not the lease holder", "SELECT * FROM pgque.receive_partitioned('q', 'pc', 0, 4, 'w2')", St("55000"))
        .with("free slot", "SELECT * FROM pgque.receive_partitioned('q', 'pc', 1, 4, 'w1')", St("55000"))
        .with("different n", "SELECT * FROM pgque.receive_partitioned('q', 'pc', 0, 8, 'w1')", St("22023"))
        .with("NULL worker", "SELECT * FROM pgque.receive_partitioned('q', 'pc', 0, 4, NULL)", St("22004"))
        .with("zero max_return", "SELECT * FROM pgque.receive_partitioned('q', 'pc', 0, 4, 'w1', 0)", St("22023")),
        row(
            "pgque.receive_partitioned(text,text,integer,integer,text,integer,interval)",
            "SELECT * FROM pgque.receive_partitioned({Q}::text, {C}::text, 0, 4, 'w1', 10, '0 s')",
            QC,
        )
        .with("not the lease holder", "SELECT * FROM pgque.receive_partitioned('q', 'pc', 0, 4, 'w2', 10, '0 s')", St("55000"))
        .with("different n", "SELECT * FROM pgque.receive_partitioned('q', 'pc', 0, 8, 'w1', 10, '0 s')", St("22023"))
        .with("zero max_return", "SELECT * FROM pgque.receive_partitioned('q', 'pc', 0, 4, 'w1', 0, '0 s')", St("22023"))
        .with("NULL wait", "SELECT * FROM pgque.receive_partitioned('q', 'pc', 0, 4, 'w1', 10, NULL)", St("22004"))
        .with("negative wait", "SELECT * FROM pgque.receive_partitioned('q', 'pc', 0, 4, 'w1', 10, '-1 s')", St("22023")),
        row(
            "pgque.ack_partitioned(text,text,integer,integer,text)",
            "SELECT pgque.ack_partitioned({Q}::text, {C}::text, 0, 4, 'w1')",
            QC,
        )
        .with("not the lease holder", "SELECT pgque.ack_partitioned('q', 'pc', 0, 4, 'w2')", St("55000"))
        .with("slot out of range", "SELECT pgque.ack_partitioned('q', 'pc', 4, 4, 'w1')", St("22003")),
        row(
            "pgque.nack_partitioned(text,text,integer,integer,text,pgque.message,interval,text)",
            "SELECT pgque.nack_partitioned({Q}::text, {C}::text, 0, 4, 'w1', \
             ROW(1, 1, 't', 'x', NULL, now(), NULL, NULL, NULL, NULL)::pgque.message)",
            QC,
        )
        .with("NULL message", "SELECT pgque.nack_partitioned('q', 'pc', 0, 4, 'w1', NULL::pgque.message)", St("22004"))
        .with("not the lease holder", "SELECT pgque.nack_partitioned('q', 'pc', 0, 4, 'w2', \
             ROW(1, 1, 't', 'x', NULL, now(), NULL, NULL, NULL, NULL)::pgque.message)", St("55000")),
        row("pgque.partition_slot(text,integer)", "", &[])
            .with("n = 0", "SELECT pgque.partition_slot('k', 0)", St("22003"))
            .with("n = 257", "SELECT pgque.partition_slot('k', 257)", St("22003")),
        // ---- pgque's own locks: granted to no role (src/locks.rs) -----------
        no_args("pgque.xact_lock(integer,bigint)", "internal, granted to no role: takes a lock, changes nothing"),
        no_args("pgque.xact_lock_shared(integer,bigint)", "internal, granted to no role: takes a lock, changes nothing"),
        no_args("pgque.try_xact_lock(integer,bigint)", "internal, granted to no role: takes a lock, changes nothing"),
        no_args(
            "pgque.partition_slot_rows()",
            "no arguments: the rows of the partition_slot_status view",
        ),
        // ---- cooperative consumers ------------------------------------------
        row(
            "pgque.register_subconsumer(text,text,text,boolean)",
            "SELECT pgque.register_subconsumer({Q}::text, 'grp', 'm9')",
            Q,
        )
        .with("normal consumer, no convert_normal", "SELECT pgque.register_subconsumer('q', 'c2', 'm9')", St("55000"))
        .with("convert a consumer with an open batch", "SELECT pgque.register_subconsumer('q', 'c', 'm9', true)", St("55000"))
        .with("NULL convert_normal", "SELECT pgque.register_subconsumer('q', 'grp', 'm9', NULL)", St("22004"))
        .with("NULL consumer", "SELECT pgque.register_subconsumer('q', NULL, 'm9')", St("22004"))
        .with("hash consumer", "SELECT pgque.register_subconsumer('q', 'g#x', 'm9')", St("42602"))
        .with("NULL member", "SELECT pgque.register_subconsumer('q', 'grp', NULL)", St("22004"))
        .with("empty member", "SELECT pgque.register_subconsumer('q', 'grp', '')", St("42602"))
        .with("quote member", "SELECT pgque.register_subconsumer('q', 'grp', 'm''; --')", Creates)
        .with("long member", format!("SELECT pgque.register_subconsumer('q', 'grp', '{}')", "m".repeat(201)), St("42622")),
        row(
            "pgque.subscribe_subconsumer(text,text,text,boolean)",
            "SELECT pgque.subscribe_subconsumer({Q}::text, 'grp', 'm9')",
            Q,
        )
        .with("normal consumer, no convert_normal", "SELECT pgque.subscribe_subconsumer('q', 'c2', 'm9', false)", St("55000"))
        .with("NULL member", "SELECT pgque.subscribe_subconsumer('q', 'grp', NULL)", St("22004"))
        .with("space member", "SELECT pgque.subscribe_subconsumer('q', 'grp', 'a b')", Creates),
        row(
            "pgque.unregister_subconsumer(text,text,text,integer)",
            "SELECT pgque.unregister_subconsumer({Q}::text, {G}::text, {M}::text, 1)",
            QGM,
        )
        .unknown_member(Noop)
        .with("batch_handling 2", "SELECT pgque.unregister_subconsumer('q', 'grp', 'm1', 2)", St("22023"))
        .with("batch_handling NULL", "SELECT pgque.unregister_subconsumer('q', 'grp', 'm1', NULL)", St("22004"))
        .with("open batch, handling 0", "SELECT pgque.unregister_subconsumer('q', 'grp', 'm1', 0)", St("55000")),
        row(
            "pgque.next_batch(text,text,text)",
            "SELECT pgque.next_batch({Q}::text, {G}::text, {M}::text)",
            QGM,
        )
        .unknown_member(Creates),
        row(
            "pgque.next_batch(text,text,text,interval)",
            // A day, not a minute: a member created here takes over a member
            // silent for longer than this (PgQue's dead interval), and a run
            // under load can pass a minute after the fixture's receive_coop,
            // which would hand m1's open batch to the new member.
            "SELECT pgque.next_batch({Q}::text, {G}::text, {M}::text, '1 day'::interval)",
            QGM,
        )
        .unknown_member(Creates)
        .with("negative dead interval", "SELECT pgque.next_batch('q', 'grp', 'm1', '-1 minute'::interval)", St("22023")),
        row(
            "pgque.receive_coop(text,text,text,integer,interval)",
            "SELECT * FROM pgque.receive_coop({Q}::text, {G}::text, {M}::text, 10)",
            QGM,
        )
        .unknown_member(Creates)
        .with("zero", "SELECT * FROM pgque.receive_coop('q', 'grp', 'm1', 0)", St("22023"))
        .with("NULL max", "SELECT * FROM pgque.receive_coop('q', 'grp', 'm1', NULL)", St("22004"))
        .with("negative dead interval", "SELECT * FROM pgque.receive_coop('q', 'grp', 'm1', 10, '-1 s')", St("22023")),
        row(
            "pgque.receive_coop_with_headers(text,text,text,integer,interval)",
            "SELECT * FROM pgque.receive_coop_with_headers({Q}::text, {G}::text, {M}::text, 10)",
            QGM,
        )
        .unknown_member(Creates)
        .with("zero", "SELECT * FROM pgque.receive_coop_with_headers('q', 'grp', 'm1', 0)", St("22023"))
        .with("negative dead interval", "SELECT * FROM pgque.receive_coop_with_headers('q', 'grp', 'm1', 10, '-1 s')", St("22023")),
        row(
            "pgque.touch_subconsumer(text,text,text)",
            "SELECT pgque.touch_subconsumer({Q}::text, {G}::text, {M}::text)",
            QGM,
        )
        .unknown_member(Noop),
        // ---- dead letters --------------------------------------------------
        row("pgque.dlq_inspect(text,integer)", "SELECT * FROM pgque.dlq_inspect({Q}::text, 10)", Q)
            .with("negative limit", "SELECT * FROM pgque.dlq_inspect('q', -1)", St("22023"))
            .with("NULL limit", "SELECT * FROM pgque.dlq_inspect('q', NULL)", St("22004")),
        row("pgque.dlq_replay(bigint)", "", &[])
            .with("NULL id", "SELECT pgque.dlq_replay(NULL)", St("22004"))
            .with("unknown id", "SELECT pgque.dlq_replay(987654321)", St("42704"))
            .with("text id", "SELECT pgque.dlq_replay('x')", St("22P02")),
        row("pgque.dlq_replay_all(text)", "SELECT pgque.dlq_replay_all({Q}::text)", Q),
        row("pgque.dlq_purge(text,interval)", "SELECT pgque.dlq_purge({Q}::text, '1 day')", Q)
            .with("negative age", "SELECT pgque.dlq_purge('q', '-1 day')", St("22023"))
            .with("NULL age", "SELECT pgque.dlq_purge('q', NULL)", St("22004")),
        // ---- observability ---------------------------------------------------
        no_args("pgque.get_queue_info()", "no arguments"),
        row("pgque.get_queue_info(text)", "SELECT * FROM pgque.get_queue_info({Q}::text)", Q),
        row("pgque.all_events(text)", "SELECT * FROM pgque.all_events({Q}::text)", Q)
            .with("job queue name", "SELECT * FROM pgque.all_events('jq')", St("42704")),
        no_args("pgque.get_consumer_info()", "no arguments"),
        row("pgque.get_consumer_info(text)", "SELECT * FROM pgque.get_consumer_info({Q}::text)", Q),
        row(
            "pgque.get_consumer_info(text,text)",
            "SELECT * FROM pgque.get_consumer_info({Q}::text, {C}::text)",
            QC,
        ),
        row("pgque.get_batch_info(bigint)", "", &[])
            .with("NULL batch", "SELECT * FROM pgque.get_batch_info(NULL)", St("22004"))
            .with("unknown batch", "SELECT * FROM pgque.get_batch_info(987654321)", St("42704")),
        // ---- administration -------------------------------------------------
        row("pgque.create_queue(text)", "", &[])
            .with("NULL", "SELECT pgque.create_queue(NULL)", St("22004"))
            .with("empty", "SELECT pgque.create_queue('')", St("42602"))
            .with("58 bytes", format!("SELECT pgque.create_queue('{}')", "q".repeat(58)), St("42622"))
            .with("29 two-byte letters", format!("SELECT pgque.create_queue('{}')", "ж".repeat(29)), St("42622"))
            .with("space", "SELECT pgque.create_queue('a b')", Creates)
            .with("quote", "SELECT pgque.create_queue('x''y')", Creates)
            .with("SQL fragment", "SELECT pgque.create_queue('q''); CREATE TABLE pwned_q (i int); --')", Creates)
            .with("SQL fragment 2", "SELECT pgque.create_queue('q\"; CREATE TABLE pwned_q2 (i int); --')", Creates)
            .with("semicolon", "SELECT pgque.create_queue('q;')", Creates)
            .with("integer", "SELECT pgque.create_queue(42)", St("42883")),
        row("pgque.drop_queue(text)", "SELECT pgque.drop_queue({Q}::text)", Q)
            .with("queue with consumers", "SELECT pgque.drop_queue('q')", St("55000")),
        row("pgque.drop_queue(text,boolean)", "SELECT pgque.drop_queue({Q}::text, false)", Q)
            .with("force not boolean", "SELECT pgque.drop_queue('q', 'maybe')", St("22P02")),
        row(
            "pgque.set_queue_config(text,text,text)",
            "SELECT pgque.set_queue_config({Q}::text, 'max_retries', '3')",
            Q,
        )
        .with("NULL param", "SELECT pgque.set_queue_config('q', NULL, '3')", St("22004"))
        .with("unknown param", "SELECT pgque.set_queue_config('q', 'bogus', '3')", St("22023"))
        .with("SQL param", "SELECT pgque.set_queue_config('q', 'max_retries = 0; --', '3')", St("22023"))
        .with("bad number", "SELECT pgque.set_queue_config('q', 'ticker_max_count', '0')", St("22023"))
        .with("not a number", "SELECT pgque.set_queue_config('q', 'ticker_max_count', '1; DROP TABLE x')", St("22023"))
        .with("negative retries", "SELECT pgque.set_queue_config('q', 'max_retries', '-1')", St("22023"))
        .with("bad duration", "SELECT pgque.set_queue_config('q', 'ticker_max_lag', 'soon')", St("22023"))
        .with("negative duration", "SELECT pgque.set_queue_config('q', 'rotation_period', '-1 hour')", St("22023"))
        .with("huge duration", "SELECT pgque.set_queue_config('q', 'rotation_period', '99999999999999999999 days')", St("22023"))
        .with("bad boolean", "SELECT pgque.set_queue_config('q', 'ticker_paused', 'perhaps')", St("22023")),
        no_args("pgque.ticker()", "no arguments"),
        row("pgque.ticker(text)", "SELECT pgque.ticker({Q}::text)", Q),
        row("pgque.force_next_tick(text)", "SELECT pgque.force_next_tick({Q}::text)", Q),
        row("pgque.force_tick(text)", "SELECT pgque.force_tick({Q}::text)", Q),
        no_args("pgque.maint()", "no arguments"),
        no_args("pgque.maint_retry_events()", "no arguments"),
        no_args("pgque.maint_operations()", "no arguments"),
        no_args("pgque.maint_idem()", "no arguments"),
        no_args("pgque.maint_delayed()", "no arguments"),
        no_args("pgque.start()", "no arguments"),
        no_args("pgque.stop()", "no arguments"),
        no_args("pgque.status()", "no arguments"),
        no_args("pgque.duty_due()", "no arguments"),
        no_args("pgque.metrics()", "no arguments"),
        no_args("pgque.version()", "no arguments"),
        // A pure function of the name: an unknown queue has a channel too.
        row("pgque.job_channel(text)", "", &[])
            .with("NULL", "SELECT pgque.job_channel(NULL)", St("22004"))
            .with("empty", "SELECT pgque.job_channel('')", St("42602"))
            .with("58 bytes", format!("SELECT pgque.job_channel('{}')", "j".repeat(58)), St("42622"))
            .with("space", "SELECT pgque.job_channel('a b')", Noop)
            .with("SQL fragment", "SELECT pgque.job_channel('q''); CREATE TABLE pwned_jc (i int); --')", Noop)
            .with("unknown queue", "SELECT pgque.job_channel('nope')", Noop),
        // ---- PgQue's API beyond section 1 (issue 17) ---------------------------
        batch_cases(
            row(
                "pgque.event_dead(bigint,bigint,text,timestamp with time zone,xid8,integer,text,text,text,text,text,text)",
                "",
                &[],
            ),
            "SELECT pgque.event_dead({X}, 1, 'r', now(), '1'::xid8, 0, 't', 'd')",
        )
        .with("NULL event", "SELECT pgque.event_dead({B}, NULL, 'r', now(), '1'::xid8, 0, 't', 'd')", St("22004"))
        .with("NULL ev_time", "SELECT pgque.event_dead({B}, 1, 'r', NULL, '1'::xid8, 0, 't', 'd')", St("22004"))
        .with("negative ev_retry", "SELECT pgque.event_dead({B}, 1, 'r', now(), '1'::xid8, -1, 't', 'd')", St("22023"))
        .with("txid as a timestamp", "SELECT pgque.event_dead({B}, 1, 'r', now(), now(), 0, 't', 'd')", St("42883")),
        row(
            "pgque.insert_event_bulk(text,text,text[])",
            "SELECT pgque.insert_event_bulk({Q}::text, 't', ARRAY['x'])",
            Q,
        )
        .with("NULL type", "SELECT pgque.insert_event_bulk('q', NULL, ARRAY['x'])", St("22004"))
        .with("NULL array", "SELECT pgque.insert_event_bulk('q', 't', NULL)", St("22004")),
        row(
            "pgque.unsubscribe_subconsumer(text,text,text,integer)",
            "SELECT pgque.unsubscribe_subconsumer({Q}::text, {G}::text, {M}::text, 1)",
            QGM,
        )
        .unknown_member(Noop)
        .with("batch_handling 2", "SELECT pgque.unsubscribe_subconsumer('q', 'grp', 'm1', 2)", St("22023"))
        .with("batch_handling NULL", "SELECT pgque.unsubscribe_subconsumer('q', 'grp', 'm1', NULL)", St("22004"))
        .with("open batch, handling 0", "SELECT pgque.unsubscribe_subconsumer('q', 'grp', 'm1')", St("55000")),
        // Unknown consumer or member names register them (PgQue's behaviour),
        // so only the queue slot is varied.
        row(
            "pgque.next_batch_custom(text,text,text,interval,integer,interval,interval)",
            "SELECT * FROM pgque.next_batch_custom({Q}::text, 'grp', 'm1', NULL, NULL, NULL)",
            Q,
        )
        .with("NULL consumer", "SELECT * FROM pgque.next_batch_custom('q', NULL, 'm1', NULL, NULL, NULL)", St("22004"))
        .with("hash consumer", "SELECT * FROM pgque.next_batch_custom('q', 'g#x', 'm1', NULL, NULL, NULL)", St("42602"))
        .with("NULL member", "SELECT * FROM pgque.next_batch_custom('q', 'grp', NULL, NULL, NULL, NULL)", St("22004"))
        .with("quote member", "SELECT * FROM pgque.next_batch_custom('q', 'grp', 'm''x', NULL, NULL, NULL)", Creates)
        .with("normal consumer", "SELECT * FROM pgque.next_batch_custom('q', 'c2', 'm1', NULL, NULL, NULL)", St("55000"))
        .with("negative lag", "SELECT * FROM pgque.next_batch_custom('q', 'grp', 'm1', '-1 s', NULL, NULL)", St("22023"))
        .with("negative count", "SELECT * FROM pgque.next_batch_custom('q', 'grp', 'm1', NULL, -1, NULL)", St("22023"))
        .with("negative interval", "SELECT * FROM pgque.next_batch_custom('q', 'grp', 'm1', NULL, NULL, '-1 s')", St("22023"))
        .with("infinite dead interval", "SELECT * FROM pgque.next_batch_custom('q', 'grp', 'm1', NULL, NULL, NULL, 'infinity')", inf_interval()),
        row(
            "pgque.unsubscribe_slot(text,text,integer)",
            "SELECT pgque.unsubscribe_slot({Q}::text, {C}::text, 1)",
            QC,
        )
        .with("slot out of range", "SELECT pgque.unsubscribe_slot('q', 'pc', 9)", St("22003"))
        .with("negative slot", "SELECT pgque.unsubscribe_slot('q', 'pc', -1)", St("22003"))
        .with("NULL slot", "SELECT pgque.unsubscribe_slot('q', 'pc', NULL)", St("22004")),
        row("pgque.create_queue(text,jsonb)", "", &[])
            .with("NULL name", "SELECT pgque.create_queue(NULL, '{}'::jsonb)", St("22004"))
            .with("empty name", "SELECT pgque.create_queue('', '{}'::jsonb)", St("42602"))
            .with("SQL in name", "SELECT pgque.create_queue('q''); CREATE TABLE pwned_o (i int); --', '{}'::jsonb)", Creates)
            .with("long name", format!("SELECT pgque.create_queue('{}', '{{}}'::jsonb)", "q".repeat(65)), St("42622"))
            .with("NULL options", "SELECT pgque.create_queue('newq', NULL::jsonb)", St("22004"))
            .with("options not an object", "SELECT pgque.create_queue('newq', '[1]'::jsonb)", St("22023"))
            .with("unknown key", "SELECT pgque.create_queue('newq', '{\"bogus\": 1}'::jsonb)", St("22023"))
            .with("SQL key", "SELECT pgque.create_queue('newq', '{\"max_retries = 0; --\": 1}'::jsonb)", St("22023"))
            .with("bad value", "SELECT pgque.create_queue('newq', '{\"max_retries\": -1}'::jsonb)", St("22023"))
            .with("array value", "SELECT pgque.create_queue('newq', '{\"max_retries\": [1]}'::jsonb)", St("22023"))
            .with("bad duration", "SELECT pgque.create_queue('newq', '{\"rotation_period\": \"soon\"}'::jsonb)", St("22023"))
            .with("not JSON", "SELECT pgque.create_queue('newq', '{x'::jsonb)", bad_json),
        row("pgque.pause_queue(text)", "SELECT pgque.pause_queue({Q}::text)", Q),
        row("pgque.resume_queue(text)", "SELECT pgque.resume_queue({Q}::text)", Q),
        row("pgque.set_tick_period_ms(integer)", "", &[])
            .with("NULL", "SELECT pgque.set_tick_period_ms(NULL)", St("22004"))
            .with("zero", "SELECT pgque.set_tick_period_ms(0)", St("22023"))
            .with("negative", "SELECT pgque.set_tick_period_ms(-10)", St("22023"))
            .with("not a divisor of 1000", "SELECT pgque.set_tick_period_ms(3)", St("22023"))
            .with("above 1000", "SELECT pgque.set_tick_period_ms(2000)", St("22023"))
            .with("text", "SELECT pgque.set_tick_period_ms('fast')", St("22P02")),
        no_args("pgque.ticker_loop()", "no arguments: a procedure that ticks until cancelled (pg_test/tests/pgq_compat.rs)"),
        no_args("pgque.uninstall()", "no arguments: drops the extension (pg_test/tests/pgq_compat.rs)"),
        row("pgque.maint_idem(text)", "SELECT pgque.maint_idem({Q}::text)", Q),
        no_args("pgque.maint_deliver_delayed()", "no arguments"),
        no_args("pgque.queue_stats()", "no arguments"),
        no_args("pgque.consumer_stats()", "no arguments"),
        no_args("pgque.queue_health()", "no arguments"),
        no_args("pgque.otel_metrics()", "no arguments"),
        row("pgque.stuck_consumers(interval)", "", &[])
            .with("NULL", "SELECT * FROM pgque.stuck_consumers(NULL)", St("22004"))
            .with("negative", "SELECT * FROM pgque.stuck_consumers('-1 hour')", St("22023"))
            .with("infinite", "SELECT * FROM pgque.stuck_consumers('infinity')", inf_interval())
            .with("not an interval", "SELECT * FROM pgque.stuck_consumers('soon')", St("22007")),
        row("pgque.in_flight(text)", "SELECT * FROM pgque.in_flight({Q}::text)", Q),
        row(
            "pgque.throughput(text,interval,interval)",
            "SELECT * FROM pgque.throughput({Q}::text, '1 hour', '1 minute')",
            Q,
        )
        .with("NULL period", "SELECT * FROM pgque.throughput('q', NULL, '1 minute')", St("22004"))
        .with("NULL bucket", "SELECT * FROM pgque.throughput('q', '1 hour', NULL)", St("22004"))
        .with("zero bucket", "SELECT * FROM pgque.throughput('q', '1 hour', '0')", St("22023"))
        .with("negative period", "SELECT * FROM pgque.throughput('q', '-1 hour', '1 minute')", St("22023"))
        .with("too many buckets", "SELECT * FROM pgque.throughput('q', '100 years', '1 second')", St("22023"))
        .with("infinite period", "SELECT * FROM pgque.throughput('q', 'infinity', '1 minute')", inf_interval()),
        row(
            "pgque.error_rate(text,interval,interval)",
            "SELECT * FROM pgque.error_rate({Q}::text, '1 hour', '1 minute')",
            Q,
        )
        .with("NULL period", "SELECT * FROM pgque.error_rate('q', NULL, '1 minute')", St("22004"))
        .with("zero bucket", "SELECT * FROM pgque.error_rate('q', '1 hour', '0 s')", St("22023"))
        .with("too many buckets", "SELECT * FROM pgque.error_rate('q', '10 years', '1 second')", St("22023")),
        no_args("pgque.logutriga()", "a trigger function: its arguments are checked when it fires (pg_test/tests/triggers.rs)"),
        no_args("pgque.sqltriga()", "a trigger function: its arguments are checked when it fires (pg_test/tests/triggers.rs)"),
        no_args("pgque.jsontriga()", "a trigger function: its arguments are checked when it fires (pg_test/tests/triggers.rs)"),
        // ---- job queues --------------------------------------------------------
        row(
            "pgque.create_job_queue(text,text,integer)",
            "",
            &[],
        )
        .with("NULL", "SELECT pgque.create_job_queue(NULL)", St("22004"))
        .with("empty", "SELECT pgque.create_job_queue('')", St("42602"))
        .with("58 bytes", format!("SELECT pgque.create_job_queue('{}')", "j".repeat(58)), St("42622"))
        .with("space", "SELECT pgque.create_job_queue('a b')", Creates)
        .with("SQL fragment", "SELECT pgque.create_job_queue('j''); CREATE TABLE pwned_j (i int); --')", Creates)
        .with("unknown mode", "SELECT pgque.create_job_queue('j2', 'lifo')", St("22023"))
        .with("NULL mode", "SELECT pgque.create_job_queue('j2', NULL)", St("22004"))
        .with("zero shards", "SELECT pgque.create_job_queue('j2', 'strict_fifo', 0)", St("22003"))
        .with("65 shards", "SELECT pgque.create_job_queue('j2', 'strict_fifo', 65)", St("22003"))
        .with("NULL shards", "SELECT pgque.create_job_queue('j2', 'strict_fifo', NULL)", St("22004"))
        // Documented: an existing queue is left as it is and 0 returned.
        .with("same name, other mode", "SELECT pgque.create_job_queue('jq', 'round_robin')", Noop),
        row("pgque.drop_job_queue(text,boolean)", "SELECT pgque.drop_job_queue({J}::text, false)", J)
            .with("queue with jobs", "SELECT pgque.drop_job_queue('jq', false)", St("55000"))
            .with("NULL force", "SELECT pgque.drop_job_queue('jq', NULL)", St("22004")),
        row(
            "pgque.set_job_queue_config(text,text,text)",
            "SELECT pgque.set_job_queue_config({J}::text, 'max_attempts', '3')",
            J,
        )
        .with("NULL param", "SELECT pgque.set_job_queue_config('jq', NULL, '3')", St("22004"))
        .with("unknown param", "SELECT pgque.set_job_queue_config('jq', 'bogus', '3')", St("22023"))
        .with("SQL param", "SELECT pgque.set_job_queue_config('jq', 'lease = 0; --', '3')", St("22023"))
        .with("max_attempts 0", "SELECT pgque.set_job_queue_config('jq', 'max_attempts', '0')", St("22003"))
        .with("max_attempts text", "SELECT pgque.set_job_queue_config('jq', 'max_attempts', 'many')", St("22023"))
        .with("negative lease", "SELECT pgque.set_job_queue_config('jq', 'lease', '-1 minute')", St("22023"))
        .with("zero lease", "SELECT pgque.set_job_queue_config('jq', 'lease', '0')", St("22023"))
        .with("infinite lease", "SELECT pgque.set_job_queue_config('jq', 'lease', 'infinity')", inf_interval())
        .with("bad lease", "SELECT pgque.set_job_queue_config('jq', 'lease', 'a while')", St("22007"))
        .with("bad mode", "SELECT pgque.set_job_queue_config('jq', 'mode', 'random')", St("22023")),
        row("pgque.pause_job_queue(text)", "SELECT pgque.pause_job_queue({J}::text)", J),
        row("pgque.resume_job_queue(text)", "SELECT pgque.resume_job_queue({J}::text)", J),
        row("pgque.set_actor_capacity(text,integer)", "", &[])
            .with("NULL actor", "SELECT pgque.set_actor_capacity(NULL, 1)", St("22004"))
            .with("empty actor", "SELECT pgque.set_actor_capacity('', 1)", St("42602"))
            .with("negative", "SELECT pgque.set_actor_capacity('a', -1)", St("22003")),
        // ---- rate limits (issue 18) -------------------------------------------
        row("pgque.set_rate_limit(text,integer,interval,integer)", "SELECT pgque.set_rate_limit({J}::text, 5, '1 minute')", J)
            .with("NULL queue", "SELECT pgque.set_rate_limit(NULL, 5, '1 minute')", St("22004"))
            .with("empty queue", "SELECT pgque.set_rate_limit('', 5, '1 minute')", St("42602"))
            .with("SQL fragment", "SELECT pgque.set_rate_limit('j''); CREATE TABLE pwned_r (i int); --', 5, '1 minute')", St("42704"))
            .with("unknown queue", "SELECT pgque.set_rate_limit('nope', 5, '1 minute')", St("42704"))
            .with("zero jobs", "SELECT pgque.set_rate_limit('jq', 0, '1 minute')", St("22003"))
            .with("NULL per", "SELECT pgque.set_rate_limit('jq', 5, NULL)", St("22004"))
            .with("zero per", "SELECT pgque.set_rate_limit('jq', 5, '0')", St("22023"))
            .with("negative per", "SELECT pgque.set_rate_limit('jq', 5, '-1 minute')", St("22023"))
            .with("infinite per", "SELECT pgque.set_rate_limit('jq', 5, 'infinity')", inf_interval())
            .with("zero burst", "SELECT pgque.set_rate_limit('jq', 5, '1 minute', 0)", St("22003")),
        row("pgque.set_actor_rate_limit(text,integer,interval,integer)", "", &[])
            .with("NULL actor", "SELECT pgque.set_actor_rate_limit(NULL, 5, '1 minute')", St("22004"))
            .with("empty actor", "SELECT pgque.set_actor_rate_limit('', 5, '1 minute')", St("42602"))
            .with("zero jobs", "SELECT pgque.set_actor_rate_limit('a', 0, '1 minute')", St("22003"))
            .with("NULL per", "SELECT pgque.set_actor_rate_limit('a', 5, NULL)", St("22004"))
            .with("zero per", "SELECT pgque.set_actor_rate_limit('a', 5, '0')", St("22023"))
            .with("negative burst", "SELECT pgque.set_actor_rate_limit('a', 5, '1 minute', -1)", St("22003")),
        // ---- schedules ---------------------------------------------------------
        row(
            "pgque.create_schedule(text,text,text,text,jsonb,text,integer,text,integer)",
            "SELECT pgque.create_schedule('s2', '@daily', {J}::text, 'k')",
            J,
        )
        .with("NULL name", "SELECT pgque.create_schedule(NULL, '@daily', 'jq', 'k')", St("22004"))
        .with("empty name", "SELECT pgque.create_schedule('', '@daily', 'jq', 'k')", St("42602"))
        .with("201 bytes name", format!("SELECT pgque.create_schedule('{}', '@daily', 'jq', 'k')", "s".repeat(201)), St("42622"))
        .with("SQL fragment name", "SELECT pgque.create_schedule('s''); CREATE TABLE pwned_s (i int); --', '@daily', 'jq', 'k')", Creates)
        .with("duplicate name", "SELECT pgque.create_schedule('sch', '@daily', 'jq', 'k')", St("42710"))
        .with("NULL cron", "SELECT pgque.create_schedule('s2', NULL, 'jq', 'k')", St("22004"))
        .with("bad cron", "SELECT pgque.create_schedule('s2', '* * *', 'jq', 'k')", St("22007"))
        .with("cron out of range", "SELECT pgque.create_schedule('s2', '0 25 * * *', 'jq', 'k')", St("22007"))
        .with("cron SQL fragment", "SELECT pgque.create_schedule('s2', '''; DROP TABLE pgque.jobs; --', 'jq', 'k')", St("22007"))
        .with("unknown alias", "SELECT pgque.create_schedule('s2', '@reboot', 'jq', 'k')", St("22007"))
        .with("cron that never fires", "SELECT pgque.create_schedule('s2', '0 0 31 2 *', 'jq', 'k')", St("22023"))
        .with("NULL kind", "SELECT pgque.create_schedule('s2', '@daily', 'jq', NULL)", St("22004"))
        .with("empty kind", "SELECT pgque.create_schedule('s2', '@daily', 'jq', '')", St("22023"))
        .with("NULL args", "SELECT pgque.create_schedule('s2', '@daily', 'jq', 'k', NULL)", St("22004"))
        .with("args not an object", "SELECT pgque.create_schedule('s2', '@daily', 'jq', 'k', '[1, 2]')", St("22023"))
        .with("not JSON", "SELECT pgque.create_schedule('s2', '@daily', 'jq', 'k', '{'::jsonb)", bad_json)
        .with("NULL timezone", "SELECT pgque.create_schedule('s2', '@daily', 'jq', 'k', '{}', NULL)", St("22004"))
        .with("unknown timezone", "SELECT pgque.create_schedule('s2', '@daily', 'jq', 'k', '{}', 'Mars/Olympus')", St("22023"))
        .with("timezone SQL fragment", "SELECT pgque.create_schedule('s2', '@daily', 'jq', 'k', '{}', 'UTC''; --')", St("22023"))
        .with("priority too high", "SELECT pgque.create_schedule('s2', '@daily', 'jq', 'k', '{}', 'UTC', 1001)", St("22003"))
        .with("NULL priority", "SELECT pgque.create_schedule('s2', '@daily', 'jq', 'k', '{}', 'UTC', NULL)", St("22004"))
        .with("NULL misfire", "SELECT pgque.create_schedule('s2', '@daily', 'jq', 'k', '{}', 'UTC', 0, NULL)", St("22004"))
        .with("unknown misfire", "SELECT pgque.create_schedule('s2', '@daily', 'jq', 'k', '{}', 'UTC', 0, 'later')", St("22023"))
        .with("max_attempts 0", "SELECT pgque.create_schedule('s2', '@daily', 'jq', 'k', '{}', 'UTC', 0, 'skip', 0)", St("22003")),
        row(
            "pgque.alter_schedule(text,text,text,text,jsonb,text,integer,text,integer)",
            "SELECT pgque.alter_schedule({S}::text, kind => 'k2')",
            &[Schedule],
        )
        .with("bad cron", "SELECT pgque.alter_schedule('sch', cron => '* * * * * * *')", St("22007"))
        .with("unknown timezone", "SELECT pgque.alter_schedule('sch', timezone => 'Nowhere')", St("22023"))
        .with("unknown queue", "SELECT pgque.alter_schedule('sch', queue_name => 'nope')", St("42704"))
        .with("bad queue name", "SELECT pgque.alter_schedule('sch', queue_name => E'a\\tb')", St("42602"))
        .with("empty kind", "SELECT pgque.alter_schedule('sch', kind => '')", St("22023"))
        .with("args not an object", "SELECT pgque.alter_schedule('sch', args => '\"x\"')", St("22023"))
        .with("priority too low", "SELECT pgque.alter_schedule('sch', priority => -1001)", St("22003"))
        .with("unknown misfire", "SELECT pgque.alter_schedule('sch', misfire => 'all')", St("22023"))
        .with("max_attempts 1001", "SELECT pgque.alter_schedule('sch', max_attempts => 1001)", St("22003")),
        row("pgque.pause_schedule(text)", "SELECT pgque.pause_schedule({S}::text)", &[Schedule]),
        row("pgque.resume_schedule(text)", "SELECT pgque.resume_schedule({S}::text)", &[Schedule]),
        row("pgque.drop_schedule(text)", "SELECT pgque.drop_schedule({S}::text)", &[Schedule]),
        no_args("pgque.run_schedules()", "no arguments"),
        row(
            "pgque.enqueue(text,text,jsonb,integer,timestamp with time zone,text,text,text,text,integer,text,bigint[],jsonb)",
            "SELECT pgque.enqueue({J}::text, 'k')",
            J,
        )
        .with("NULL kind", "SELECT pgque.enqueue('jq', NULL)", St("22004"))
        .with("empty kind", "SELECT pgque.enqueue('jq', '')", St("22023"))
        .with("NULL args", "SELECT pgque.enqueue('jq', 'k', NULL)", St("22004"))
        .with("not JSON", "SELECT pgque.enqueue('jq', 'k', '{'::jsonb)", bad_json)
        .with("priority too high", "SELECT pgque.enqueue('jq', 'k', '{}', 1001)", St("22003"))
        .with("unknown parent", "SELECT pgque.enqueue('jq', 'k', depends_on => ARRAY[987654321]::bigint[])", St("42704"))
        .with("NULL parent", "SELECT pgque.enqueue('jq', 'k', depends_on => ARRAY[NULL]::bigint[])", St("22004"))
        .with("priority too low", "SELECT pgque.enqueue('jq', 'k', '{}', -1001)", St("22003"))
        .with("priority beyond int", "SELECT pgque.enqueue('jq', 'k', '{}', '99999999999')", St("22003"))
        .with("NULL priority", "SELECT pgque.enqueue('jq', 'k', '{}', NULL)", St("22004"))
        .with("infinite run_at", "SELECT pgque.enqueue('jq', 'k', '{}', 0, 'infinity')", St("22023"))
        .with("max_attempts 0", "SELECT pgque.enqueue('jq', 'k', '{}', 0, NULL, NULL, NULL, NULL, NULL, 0)", St("22003"))
        .with("max_attempts 1001", "SELECT pgque.enqueue('jq', 'k', '{}', 0, NULL, NULL, NULL, NULL, NULL, 1001)", St("22003"))
        .with("bad on_duplicate", "SELECT pgque.enqueue('jq', 'k', '{}', 0, NULL, NULL, NULL, NULL, 'u', NULL, 'explode')", St("22023"))
        .with("duplicate, on_duplicate error", "SELECT pgque.enqueue('jq', 'k', '{}', 0, NULL, NULL, NULL, NULL, 'held', NULL, 'error')", St("23505"))
        .with("headers not an object", "SELECT pgque.enqueue('jq', 'k', headers => '[\"00-x\"]')", St("22023"))
        .with("headers value not a string", "SELECT pgque.enqueue('jq', 'k', headers => '{\"traceparent\": 1}')", St("22023"))
        .with("headers over 1 kB", "SELECT pgque.enqueue('jq', 'k', headers => jsonb_build_object('tracestate', repeat('a', 1100)))", St("54000"))
        .with("bad headers with depends_on", "SELECT pgque.enqueue('jq', 'k', depends_on => ARRAY[1]::bigint[], headers => '{\"traceparent\": 1}')", St("22023")),
        row(
            "pgque.enqueue_ready_rows(text,text[],jsonb[],smallint[],timestamp with time zone[],text[],text[],text[],text[],integer[],text,jsonb[])",
            "SELECT * FROM pgque.enqueue_ready_rows({J}::text, ARRAY['k'], ARRAY['{}']::jsonb[])",
            J,
        )
        .with("NULL kinds", "SELECT * FROM pgque.enqueue_ready_rows('jq', NULL, ARRAY['{}']::jsonb[])", St("22004"))
        .with("NULL args", "SELECT * FROM pgque.enqueue_ready_rows('jq', ARRAY['k'], NULL)", St("22004"))
        .with("NULL kind element", "SELECT * FROM pgque.enqueue_ready_rows('jq', ARRAY['k', NULL], ARRAY['{}', '{}']::jsonb[])", St("22004"))
        .with("empty kind element", "SELECT * FROM pgque.enqueue_ready_rows('jq', ARRAY[''], ARRAY['{}']::jsonb[])", St("22023"))
        .with("NULL args element", "SELECT * FROM pgque.enqueue_ready_rows('jq', ARRAY['k'], ARRAY[NULL]::jsonb[])", St("22004"))
        .with("length mismatch", "SELECT * FROM pgque.enqueue_ready_rows('jq', ARRAY['k', 'k'], ARRAY['{}']::jsonb[])", St("22023"))
        .with("priorities mismatch", "SELECT * FROM pgque.enqueue_ready_rows('jq', ARRAY['k'], ARRAY['{}']::jsonb[], ARRAY[1, 2]::smallint[])", St("22023"))
        .with("priority out of range", "SELECT * FROM pgque.enqueue_ready_rows('jq', ARRAY['k'], ARRAY['{}']::jsonb[], ARRAY[5000]::smallint[])", St("22003"))
        .with("infinite run_at", "SELECT * FROM pgque.enqueue_ready_rows('jq', ARRAY['k'], ARRAY['{}']::jsonb[], NULL, ARRAY['infinity']::timestamptz[])", St("22023"))
        .with("max_attempts 0", "SELECT * FROM pgque.enqueue_ready_rows('jq', ARRAY['k'], ARRAY['{}']::jsonb[], NULL, NULL, NULL, NULL, NULL, NULL, ARRAY[0])", St("22003"))
        .with("bad on_duplicate", "SELECT * FROM pgque.enqueue_ready_rows('jq', ARRAY['k'], ARRAY['{}']::jsonb[], on_duplicate => 'nope')", St("22023"))
        .with("headers mismatch", "SELECT * FROM pgque.enqueue_ready_rows('jq', ARRAY['k'], ARRAY['{}']::jsonb[], headers => ARRAY[NULL, NULL]::jsonb[])", St("22023"))
        .with("headers element not an object", "SELECT * FROM pgque.enqueue_ready_rows('jq', ARRAY['k'], ARRAY['{}']::jsonb[], headers => ARRAY['\"x\"']::jsonb[])", St("22023"))
        .with("headers element over 1 kB", "SELECT * FROM pgque.enqueue_ready_rows('jq', ARRAY['k'], ARRAY['{}']::jsonb[], headers => ARRAY[jsonb_build_object('a', repeat('b', 1100))])", St("54000")),
        row(
            "pgque.dispatch(text[],integer,text,interval,integer)",
            "SELECT * FROM pgque.dispatch(ARRAY[{J}::text], 1, 'w', '1 minute')",
            J,
        )
        .with("NULL queues", "SELECT * FROM pgque.dispatch(NULL, 1, 'w')", St("22004"))
        .with("empty queues", "SELECT * FROM pgque.dispatch(ARRAY[]::text[], 1, 'w')", St("22023"))
        .with("NULL limit", "SELECT * FROM pgque.dispatch(ARRAY['jq'], NULL, 'w')", St("22004"))
        .with("zero limit", "SELECT * FROM pgque.dispatch(ARRAY['jq'], 0, 'w')", St("22003"))
        .with("negative limit", "SELECT * FROM pgque.dispatch(ARRAY['jq'], -5, 'w')", St("22003"))
        .with("huge limit", "SELECT * FROM pgque.dispatch(ARRAY['jq'], 2000000000, 'w')", St("22003"))
        .with("NULL worker", "SELECT * FROM pgque.dispatch(ARRAY['jq'], 1, NULL)", St("22004"))
        .with("empty worker", "SELECT * FROM pgque.dispatch(ARRAY['jq'], 1, '')", St("42602"))
        .with("long worker", format!("SELECT * FROM pgque.dispatch(ARRAY['jq'], 1, '{}')", "w".repeat(201)), St("42622"))
        .with("zero lease", "SELECT * FROM pgque.dispatch(ARRAY['jq'], 1, 'w', '0')", St("22023"))
        .with("negative lease", "SELECT * FROM pgque.dispatch(ARRAY['jq'], 1, 'w', '-1 minute')", St("22023"))
        .with("infinite lease", "SELECT * FROM pgque.dispatch(ARRAY['jq'], 1, 'w', 'infinity')", inf_interval())
        .with("oversample 0", "SELECT * FROM pgque.dispatch(ARRAY['jq'], 1, 'w', NULL, 0)", St("22003"))
        .with("NULL queue element", "SELECT * FROM pgque.dispatch(ARRAY['jq', NULL], 1, 'w')", St("22004")),
        row(
            "pgque.dispatch_wait(text[],integer,text,interval,interval,integer)",
            "SELECT * FROM pgque.dispatch_wait(ARRAY[{J}::text], 1, 'w', '0 s', '1 minute')",
            J,
        )
        .with("NULL queues", "SELECT * FROM pgque.dispatch_wait(NULL, 1, 'w', '0 s')", St("22004"))
        .with("empty queues", "SELECT * FROM pgque.dispatch_wait(ARRAY[]::text[], 1, 'w', '0 s')", St("22023"))
        .with("zero limit", "SELECT * FROM pgque.dispatch_wait(ARRAY['jq'], 0, 'w', '0 s')", St("22003"))
        .with("NULL worker", "SELECT * FROM pgque.dispatch_wait(ARRAY['jq'], 1, NULL, '0 s')", St("22004"))
        .with("NULL wait", "SELECT * FROM pgque.dispatch_wait(ARRAY['jq'], 1, 'w', NULL)", St("22004"))
        .with("negative wait", "SELECT * FROM pgque.dispatch_wait(ARRAY['jq'], 1, 'w', '-1 s')", St("22023"))
        .with("zero lease", "SELECT * FROM pgque.dispatch_wait(ARRAY['jq'], 1, 'w', '0 s', '0')", St("22023"))
        .with("oversample 0", "SELECT * FROM pgque.dispatch_wait(ARRAY['jq'], 1, 'w', '0 s', NULL, 0)", St("22003")),
        row("pgque.complete(bigint,bigint,jsonb)", "", &[])
            .with("unknown job", "SELECT pgque.complete(987654321, 1)", Noop)
            .with("stale token", "SELECT pgque.complete((SELECT min(id) FROM pgque.jobs), 987654321)", Noop)
            .with("stale token with output", "SELECT pgque.complete((SELECT min(id) FROM pgque.jobs), 987654321, '{\"r\": 1}')", Noop)
            .with("NULL job", "SELECT pgque.complete(NULL, 1)", St("22004"))
            .with("NULL token", "SELECT pgque.complete(1, NULL)", St("22004"))
            .with("text job", "SELECT pgque.complete('x', 1)", St("22P02"))
            .with("not JSON output", "SELECT pgque.complete(1, 1, 'x')", St("22P02"))
            .with("output over the cap", "SELECT pgque.complete(1, 1, jsonb_build_object('x', repeat('a', 1048577)))", St("54000")),
        row("pgque.complete_many(bigint[],bigint[],jsonb[])", "", &[])
            .with("NULL ids", "SELECT pgque.complete_many(NULL, ARRAY[1]::bigint[])", St("22004"))
            .with("NULL tokens", "SELECT pgque.complete_many(ARRAY[1]::bigint[], NULL)", St("22004"))
            .with("length mismatch", "SELECT pgque.complete_many(ARRAY[1, 2]::bigint[], ARRAY[1]::bigint[])", St("22023"))
                        .with("beyond the cap", "SELECT pgque.complete_many(array_fill(1::bigint, ARRAY[10001]), array_fill(1::bigint, ARRAY[10001]))", St("54000"))
            .with("outputs length mismatch", "SELECT pgque.complete_many(ARRAY[1]::bigint[], ARRAY[1]::bigint[], ARRAY['1', '2']::jsonb[])", St("22023"))
            .with("output over the cap", "SELECT pgque.complete_many(ARRAY[1]::bigint[], ARRAY[1]::bigint[], ARRAY[jsonb_build_object('x', repeat('a', 1048577))])", St("54000"))
            .with("unknown jobs", "SELECT pgque.complete_many(ARRAY[987654321]::bigint[], ARRAY[1]::bigint[])", Noop)
            .with("unknown jobs with outputs", "SELECT pgque.complete_many(ARRAY[987654321]::bigint[], ARRAY[1]::bigint[], ARRAY['1']::jsonb[])", Noop),
        row("pgque.set_progress(bigint,bigint,jsonb)", "", &[])
            .with("unknown job", "SELECT pgque.set_progress(987654321, 1, '1')", Noop)
            .with("stale token", "SELECT pgque.set_progress((SELECT min(id) FROM pgque.jobs), 987654321, '1')", Noop)
            .with("NULL job", "SELECT pgque.set_progress(NULL, 1, '1')", St("22004"))
            .with("NULL token", "SELECT pgque.set_progress(1, NULL, '1')", St("22004"))
            .with("NULL progress", "SELECT pgque.set_progress(1, 1, NULL)", St("22004"))
            .with("not JSON", "SELECT pgque.set_progress(1, 1, 'x')", St("22P02"))
            .with("over the cap", "SELECT pgque.set_progress(1, 1, jsonb_build_object('x', repeat('a', 65537)))", St("54000")),
        row("pgque.fail(bigint,bigint,text,timestamp with time zone)", "", &[])
            .with("NULL job", "SELECT pgque.fail(NULL, 1, 'e')", St("22004"))
            .with("NULL token", "SELECT pgque.fail(1, NULL, 'e')", St("22004"))
            .with("NULL error", "SELECT pgque.fail(1, 1, NULL)", St("22004"))
            .with("infinite retry_at", "SELECT pgque.fail(1, 1, 'e', 'infinity')", St("22023"))
            .with("unknown job", "SELECT pgque.fail(987654321, 1, 'e')", Noop),
        row("pgque.heartbeat(bigint[],bigint[],interval)", "", &[])
            .with("NULL ids", "SELECT * FROM pgque.heartbeat(NULL, ARRAY[1]::bigint[], '1 minute')", St("22004"))
            .with("length mismatch", "SELECT * FROM pgque.heartbeat(ARRAY[1,2]::bigint[], ARRAY[1]::bigint[], '1 minute')", St("22023"))
            .with("beyond the cap", "SELECT * FROM pgque.heartbeat(array_fill(1::bigint, ARRAY[10001]), array_fill(1::bigint, ARRAY[10001]), '1 minute')", St("54000"))
            .with("zero extend", "SELECT * FROM pgque.heartbeat(ARRAY[1]::bigint[], ARRAY[1]::bigint[], '0')", St("22023"))
            .with("negative extend", "SELECT * FROM pgque.heartbeat(ARRAY[1]::bigint[], ARRAY[1]::bigint[], '-1 minute')", St("22023"))
            .with("unknown job", "SELECT * FROM pgque.heartbeat(ARRAY[987654321]::bigint[], ARRAY[1]::bigint[], '1 minute')", Noop)
            .with("infinite extend", "SELECT * FROM pgque.heartbeat(ARRAY[1]::bigint[], ARRAY[1]::bigint[], 'infinity')", inf_interval()),
        row("pgque.snooze(bigint,bigint,timestamp with time zone)", "", &[])
            .with("NULL job", "SELECT pgque.snooze(NULL, 1, now())", St("22004"))
            .with("NULL until", "SELECT pgque.snooze(1, 1, NULL)", St("22004"))
            .with("infinite until", "SELECT pgque.snooze(1, 1, 'infinity')", St("22023"))
            .with("unknown job", "SELECT pgque.snooze(987654321, 1, now())", Noop),
        row("pgque.cancel(bigint)", "", &[])
            .with("NULL job", "SELECT pgque.cancel(NULL)", St("22004"))
            .with("unknown job", "SELECT pgque.cancel(987654321)", St("42704")),
        row("pgque.retry_job(bigint)", "", &[])
            .with("NULL job", "SELECT pgque.retry_job(NULL)", St("22004"))
            .with("unknown job", "SELECT pgque.retry_job(987654321)", St("42704"))
            .with("job not failed", "SELECT pgque.retry_job((SELECT min(id) FROM pgque.jobs))", St("55000")),
        row("pgque.rescue_expired_leases(integer)", "", &[])
            .with("zero", "SELECT pgque.rescue_expired_leases(0)", St("22003"))
            .with("NULL", "SELECT pgque.rescue_expired_leases(NULL)", St("22004")),
        row("pgque.promote_scheduled_jobs(integer)", "", &[])
            .with("negative", "SELECT pgque.promote_scheduled_jobs(-1)", St("22003"))
            .with("too many", "SELECT pgque.promote_scheduled_jobs(100001)", St("22003")),
        row("pgque.sweep_job_events(integer)", "", &[])
            .with("zero", "SELECT pgque.sweep_job_events(0)", St("22003"))
            .with("NULL", "SELECT pgque.sweep_job_events(NULL)", St("22004")),
        row("pgque.prune_jobs(integer)", "", &[])
            .with("zero", "SELECT pgque.prune_jobs(0)", St("22003"))
            .with("NULL", "SELECT pgque.prune_jobs(NULL)", St("22004")),
        no_args("pgque.job_maint()", "no arguments"),
        no_args("pgque.job_analyze()", "no arguments"),
        no_args("pgque.rotate_job_log()", "no arguments"),
        // STRICT: NULL is no job; an unknown id is no row, not an error
        row(
            "pgque.enqueue_flow(text,jsonb)",
            "SELECT * FROM pgque.enqueue_flow({J}::text, '[{\"key\": \"a\", \"kind\": \"k\"}]')",
            J,
        )
        .with("NULL jobs", "SELECT * FROM pgque.enqueue_flow('jq', NULL)", St("22004"))
        .with("not an array", "SELECT * FROM pgque.enqueue_flow('jq', '{}')", St("22023"))
        .with("empty", "SELECT * FROM pgque.enqueue_flow('jq', '[]')", St("22023"))
        .with("headers not an object", "SELECT * FROM pgque.enqueue_flow('jq', '[{\"key\": \"a\", \"kind\": \"k\", \"headers\": [1]}]')", St("22023"))
        .with("headers over 1 kB", "SELECT * FROM pgque.enqueue_flow('jq', jsonb_build_array(jsonb_build_object('key', 'a', 'kind', 'k', 'headers', jsonb_build_object('t', repeat('a', 1100)))))", St("54000"))
        .with("not JSON", "SELECT * FROM pgque.enqueue_flow('jq', '[')", bad_json)
        .with("unknown field", "SELECT * FROM pgque.enqueue_flow('jq', '[{\"key\": \"a\", \"kind\": \"k\", \"x\": 1}]')", St("42703"))
        .with("no key", "SELECT * FROM pgque.enqueue_flow('jq', '[{\"kind\": \"k\"}]')", St("22004"))
        .with("duplicate key", "SELECT * FROM pgque.enqueue_flow('jq', '[{\"key\": \"a\", \"kind\": \"k\"}, {\"key\": \"a\", \"kind\": \"k\"}]')", St("42710"))
        .with("unknown parent key", "SELECT * FROM pgque.enqueue_flow('jq', '[{\"key\": \"a\", \"kind\": \"k\", \"depends_on\": [\"b\"]}]')", St("42704"))
        .with("cycle", "SELECT * FROM pgque.enqueue_flow('jq', '[{\"key\": \"a\", \"kind\": \"k\", \"depends_on\": [\"a\"]}]')", St("42P19")),
        // STRICT: NULL is no job / flow; unknown ones are no row
        row("pgque.job_parents(bigint)", "", &[])
            .with("NULL job", "SELECT * FROM pgque.job_parents(NULL)", Noop)
            .with("unknown job", "SELECT * FROM pgque.job_parents(987654321)", Noop),
        row("pgque.flow_status(bigint)", "", &[])
            .with("NULL flow", "SELECT * FROM pgque.flow_status(NULL)", Noop)
            .with("unknown flow", "SELECT * FROM pgque.flow_status(987654321)", Noop),
        row("pgque.get_job(bigint)", "", &[])
            .with("NULL job", "SELECT * FROM pgque.get_job(NULL)", Noop)
            .with("unknown job", "SELECT * FROM pgque.get_job(987654321)", Noop),
        // the job explorer (sql/34_explorer.sql): a NULL filter means "any"
        row("pgque.list_jobs(text,text,text,text,bigint,integer)", "", &[])
            .with("unknown queue", "SELECT * FROM pgque.list_jobs('nope')", St("42704"))
            .with("unknown state", "SELECT * FROM pgque.list_jobs(NULL, 'gone')", St("22023"))
            .with("max_jobs 0", "SELECT * FROM pgque.list_jobs(max_jobs => 0)", St("22003"))
            .with("max_jobs 1001", "SELECT * FROM pgque.list_jobs(max_jobs => 1001)", St("22003"))
            .with("search too long", "SELECT * FROM pgque.list_jobs(search => repeat('x', 201))", St("22001")),
        row("pgque.match_jobs(text,text,text,text,text,integer)", "", &[])
            .with("NULL action", "SELECT * FROM pgque.match_jobs(NULL)", St("22023"))
            .with("unknown action", "SELECT * FROM pgque.match_jobs('bogus')", St("22023"))
            .with("unknown queue", "SELECT * FROM pgque.match_jobs('retry', 'nope')", St("42704"))
            .with("max_jobs 0", "SELECT * FROM pgque.match_jobs('retry', max_jobs => 0)", St("22003")),
        row("pgque.job_detail(bigint)", "", &[])
            .with("NULL job", "SELECT pgque.job_detail(NULL)", Noop)
            .with("unknown job", "SELECT pgque.job_detail(987654321)", Noop),
        row("pgque.job_timeline(bigint)", "", &[])
            .with("NULL job", "SELECT * FROM pgque.job_timeline(NULL)", Noop)
            .with("unknown job", "SELECT * FROM pgque.job_timeline(987654321)", Noop),
        row("pgque.job_children(bigint)", "", &[])
            .with("NULL job", "SELECT * FROM pgque.job_children(NULL)", Noop)
            .with("unknown job", "SELECT * FROM pgque.job_children(987654321)", Noop),
        row("pgque.flow_graph(bigint,integer)", "", &[])
            .with("NULL flow", "SELECT * FROM pgque.flow_graph(NULL)", Noop)
            .with("unknown flow", "SELECT * FROM pgque.flow_graph(987654321)", Noop)
            .with("max_jobs 0", "SELECT * FROM pgque.flow_graph(1, 0)", St("22003")),
        // the event browser (sql/35_event_browser.sql)
        row("pgque.browse_events(text,text,bigint,bigint,integer)", "", &[])
            .with("NULL queue", "SELECT * FROM pgque.browse_events(NULL)", St("22004"))
            .with("unknown queue", "SELECT * FROM pgque.browse_events('nope')", St("42704"))
            .with("unknown consumer", "SELECT * FROM pgque.browse_events('q', 'nobody')", St("42704"))
            .with("max_events 0", "SELECT * FROM pgque.browse_events('q', max_events => 0)", St("22003"))
            .with("max_events 1001", "SELECT * FROM pgque.browse_events('q', max_events => 1001)", St("22003"))
            .with("negative cursor", "SELECT * FROM pgque.browse_events('q', NULL, -1, 1)", St("22003"))
            .with("unknown cursor", "SELECT * FROM pgque.browse_events('q', 'c', 9007199254740991, 1)", Noop),
        row("pgque.browse_dead_letters(text,bigint,integer)", "", &[])
            .with("NULL queue", "SELECT * FROM pgque.browse_dead_letters(NULL)", St("22004"))
            .with("unknown queue", "SELECT * FROM pgque.browse_dead_letters('nope')", St("42704"))
            .with("max_letters 0", "SELECT * FROM pgque.browse_dead_letters('q', NULL, 0)", St("22003"))
            .with("max_letters 1001", "SELECT * FROM pgque.browse_dead_letters('q', NULL, 1001)", St("22003")),
        // the history rollup (sql/36_history.sql)
        row("pgque.maint_history(interval,timestamp with time zone)", "", &[])
            .with("NULL keep", "SELECT pgque.maint_history(NULL)", St("22023"))
            .with("keep 0", "SELECT pgque.maint_history('0 s')", St("22023"))
            .with("keep a year", "SELECT pgque.maint_history('1 year')", St("22023"))
            .with("NULL at", "SELECT pgque.maint_history('1 hour', NULL)", St("22023"))
            .with("at tomorrow", "SELECT pgque.maint_history('1 hour', now() + interval '1 day')", St("22023")),
        row("pgque.read_history(interval)", "", &[])
            .with("NULL since", "SELECT * FROM pgque.read_history(NULL)", St("22023"))
            .with("since -1 h", "SELECT * FROM pgque.read_history('-1 hour')", St("22023"))
            .with("since 40 days", "SELECT * FROM pgque.read_history('40 days')", St("22023")),
        row("pgque.run_schedule_now(text)", "", &[])
            .with("NULL name", "SELECT pgque.run_schedule_now(NULL)", Noop)
            .with("unknown schedule", "SELECT pgque.run_schedule_now('nope')", St("42704")),
        no_args("pgque.job_log_blockers()", "no arguments"),
        no_args("pgque.ticker_loop_tick()", "no arguments: ticks, returns the period (ticker_loop's step)"),
        no_args("pgque.maint_rotate_tables_step2()", "no arguments"),
        row("pgque.maint_rotate_tables_step1(text)", "SELECT pgque.maint_rotate_tables_step1({Q}::text)", &[Queue]),
    ]
}

/// Every case of the matrix as (function, label, SQL, expectation).
fn cases(ids: &Ids) -> Vec<(String, String, String, Expect)> {
    let fill = |s: &str| {
        s.replace("{BD}", &ids.done.to_string())
            .replace("{BM}", &ids.member_open.to_string())
            .replace("{B}", &ids.open.to_string())
    };
    let mut out = vec![];
    for r in matrix() {
        for &slot in r.slots {
            let cases = match (r.unknown_member, slot) {
                (Some(e), Consumer | Group | Member) => name_cases_unknown(slot, e),
                _ => name_cases(slot),
            };
            for (label, value, e) in cases {
                let mut sql = r.template.replace(slot.tag(), &value);
                for &other in r.slots {
                    sql = sql.replace(other.tag(), other.valid());
                }
                out.push((
                    r.sig.to_string(),
                    format!("{slot:?}: {label}"),
                    fill(&sql),
                    e,
                ));
            }
        }
        for (label, sql, e) in r.extra {
            out.push((r.sig.to_string(), label.to_string(), fill(&sql), e));
        }
    }
    out
}

/// Row counts of every pgque table, plus hostile objects that must not exist.
fn state(c: &mut Client) -> BTreeMap<String, i64> {
    let tables: Vec<String> = c
        .query(
            "SELECT format('%I.%I', schemaname, tablename) FROM pg_tables \
              WHERE schemaname = 'pgque' ORDER BY 1",
            &[],
        )
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    let mut sql: Vec<String> = tables
        .iter()
        .map(|t| format!("SELECT '{t}', count(*) FROM {t}"))
        .collect();
    sql.push(
        "SELECT 'pwned objects', (SELECT count(*) FROM pg_class WHERE relname ILIKE '%pwned%') \
           + (SELECT count(*) FROM pg_roles WHERE rolname ILIKE '%pwned%') \
           + (SELECT count(*) FROM pg_proc WHERE proname ILIKE '%pwned%')"
            .into(),
    );
    sql.push("SELECT 'pgque tables', count(*) FROM pg_tables WHERE schemaname = 'pgque'".into());
    sql.push("SELECT 'open cursors', count(*) FROM pg_cursors".into());
    c.query(&sql.join(" UNION ALL "), &[])
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect()
}

fn fixture(c: &mut Client) -> Ids {
    stop_worker(c);
    c.batch_execute(
        "SELECT pgque.create_queue('q'); SELECT pgque.subscribe('q', 'c'); \
         SELECT pgque.subscribe('q', 'c2'); \
         SELECT pgque.register_subconsumer('q', 'grp', 'm1'); \
         SELECT pgque.send_batch('q', ARRAY['a', 'b', 'c']); \
         SELECT pgque.subscribe_partitioned('q', 'pc', 4); \
         SELECT pgque.claim_slot('q', 'pc', 0, 'w1'); \
         SELECT pgque.create_job_queue('jq'); SELECT pgque.enqueue('jq', 'k'); \
         SELECT pgque.enqueue('jq', 'k', unique_key => 'held'); \
         SELECT pgque.create_schedule('sch', '@daily', 'jq', 'k')",
    )
    .unwrap();
    // A tick in a transaction of its own: it must see the events committed.
    c.batch_execute("SELECT pgque.force_tick('q')").unwrap();
    let first = |c: &mut Client, sql: &str| -> i64 {
        let rows = c.query(sql, &[]).unwrap();
        if rows.is_empty() {
            let diag: Vec<String> = c
                .query(
                    "SELECT format('tick %s seq %s pending %s snap %s', tick_id, tick_event_seq, tick_pending, tick_snapshot) FROM pgque.tick \
                     UNION ALL SELECT format('event %s txid %s', ev_id, ev_txid) FROM pgque.event_1 \
                     UNION ALL SELECT format('batch %s sub %s %s..%s floor %s ceil %s', batch_id, sub_id, prev_tick_id, tick_id, ev_floor, ev_ceiling) FROM pgque.batch \
                     UNION ALL SELECT format('sub %s %s start %s', sub_id, sub_consumer, sub_start_tick) FROM pgque.subscription",
                    &[],
                )
                .unwrap()
                .iter()
                .map(|r| r.get(0))
                .collect();
            panic!("{sql}: nothing received; state:\n{}", diag.join("\n"));
        }
        rows[0].get(0)
    };
    let open = first(c, "SELECT batch_id FROM pgque.receive('q', 'c', 10)");
    let done = first(c, "SELECT batch_id FROM pgque.receive('q', 'c2', 10)");
    c.query_one("SELECT pgque.ack($1)", &[&done]).unwrap();
    let member_open = first(
        c,
        "SELECT batch_id FROM pgque.receive_coop('q', 'grp', 'm1', 10)",
    );
    Ids {
        open,
        done,
        member_open,
    }
}

#[test]
fn every_function_refuses_bad_input_with_its_sqlstate_and_changes_nothing() {
    let db = TestDb::new("bad_input");
    let mut c = db.connect();
    let ids = fixture(&mut c);

    // Coverage: every function in schema pgque has a row.
    let known: BTreeSet<&str> = matrix().iter().map(|r| r.sig).collect();
    // regprocedure prints names qualified when their schema is not on the path.
    c.batch_execute("SET search_path = pg_catalog").unwrap();
    let actual: BTreeSet<String> = c
        .query(
            "SELECT p.oid::regprocedure::text FROM pg_proc p \
              WHERE p.pronamespace = 'pgque'::regnamespace",
            &[],
        )
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    c.batch_execute("RESET search_path").unwrap();
    let missing: Vec<&String> = actual
        .iter()
        .filter(|s| !known.contains(s.as_str()))
        .collect();
    assert!(
        missing.is_empty(),
        "functions without a row in the bad-input matrix (add them to pg_test/tests/bad_input.rs): {missing:?}"
    );
    let stale: Vec<&&str> = known.iter().filter(|s| !actual.contains(**s)).collect();
    assert!(
        stale.is_empty(),
        "matrix rows for functions that do not exist: {stale:?}"
    );

    for r in matrix() {
        assert!(
            !(r.slots.is_empty() && r.extra.is_empty()) || r.none.is_some(),
            "{}: a row without cases must say why (no_args)",
            r.sig
        );
    }
    let all = cases(&ids);
    let mut failures = vec![];
    let mut before = state(&mut c);
    assert_eq!(before["pwned objects"], 0);
    for (sig, label, sql, expect) in &all {
        let got = match c.simple_query(sql) {
            Ok(_) => "accepted".to_string(),
            Err(e) => match e.code() {
                Some(code) => format!(
                    "{} ({})",
                    code.code(),
                    e.as_db_error().map(|d| d.message()).unwrap_or("")
                ),
                None => format!("client error {e}"),
            },
        };
        let want = match expect {
            St(code) => *code,
            Noop | Creates => "accepted",
        };
        if !got.starts_with(want) {
            failures.push(format!("{sig} [{label}] {sql}\n    want {want}, got {got}"));
        }
        let after = state(&mut c);
        if *expect == Creates && got == "accepted" {
            before = after;
        } else if after != before {
            let diff: Vec<String> = after
                .iter()
                .filter(|(k, v)| before.get(*k) != Some(v))
                .map(|(k, v)| format!("{k}: {:?} -> {v}", before.get(k)))
                .collect();
            failures.push(format!("{sig} [{label}] {sql}\n    changed: {diff:?}"));
            // Go on from the changed state, so one failure is reported once.
            before = after;
        }
    }
    eprintln!(
        "{} bad-input cases over {} functions",
        all.len(),
        actual.len()
    );
    // Names are data: not one of the SQL fragments sent as a name ran, also
    // where the call accepted (and created) the name.
    assert_eq!(state(&mut c)["pwned objects"], 0, "a name ran as SQL");
    assert!(
        failures.is_empty(),
        "{} of {} cases wrong:\n{}",
        failures.len(),
        all.len(),
        failures.join("\n")
    );
}

/// Valid but unusual names are accepted where they are valid: unicode
/// letters, punctuation, spaces and quotes (PgQue's rule: any printable
/// text), the longest allowed name (NOTIFY channel derived from it fits) work
/// end to end.
#[test]
fn unusual_valid_names_work_end_to_end() {
    let db = TestDb::new("odd_names");
    let mut c = db.connect();
    // The longest names: 57 bytes (PgQue's limit), ASCII and two-byte
    // letters; a job queue of 53..57 bytes has the hashed channel form.
    let q57 = "q".repeat(57);
    let q52 = "k".repeat(52);
    let uq = "ж".repeat(28); // 56 bytes
    for q in [
        "очередь",
        "tenant-42.events:v2/eu@x",
        q57.as_str(),
        q52.as_str(),
        uq.as_str(),
        // PgQue's suite names queues after test ids: quotes and spaces.
        "pyt_\"just a st\"_x'; DROP TABLE t; --🚀",
    ] {
        let consumer = "потребитель_名前-1.a:b/c@d";
        c.query_one("SELECT pgque.create_queue($1)", &[&q]).unwrap();
        c.query_one("SELECT pgque.subscribe($1, $2)", &[&q, &consumer])
            .unwrap();
        c.query_one(
            "SELECT pgque.register_subconsumer($1, 'g', 'член#1')",
            &[&q],
        )
        .unwrap();
        let id: i64 = c
            .query_one("SELECT pgque.send($1, 'данные'::text)", &[&q])
            .unwrap()
            .get(0);
        c.query_one("SELECT pgque.force_tick($1)", &[&q]).unwrap();
        let rows = c
            .query(
                "SELECT msg_id, batch_id, payload FROM pgque.receive($1, $2, 10)",
                &[&q, &consumer],
            )
            .unwrap();
        assert_eq!(rows.len(), 1, "queue {q}");
        assert_eq!(rows[0].get::<_, i64>(0), id);
        assert_eq!(rows[0].get::<_, String>(2), "данные");
        let b: i64 = rows[0].get(1);
        c.query_one("SELECT pgque.ack($1)", &[&b]).unwrap();
        let coop = c
            .query(
                "SELECT msg_id FROM pgque.receive_coop($1, 'g', 'член#1', 10)",
                &[&q],
            )
            .unwrap();
        assert_eq!(coop.len(), 1);
        // Job queue of the same name, with a listener on its channel.
        c.query_one("SELECT pgque.create_job_queue($1)", &[&q])
            .unwrap();
        let channel: String = c
            .query_one("SELECT pgque.job_channel($1)", &[&q])
            .unwrap()
            .get(0);
        assert!(channel.len() <= 63, "{channel}");
        if q.len() <= 52 {
            assert_eq!(channel, format!("pgque_jobs_{q}"));
        } else {
            assert!(channel.starts_with("pgque_jobs_"), "{channel}");
            assert_ne!(channel, format!("pgque_jobs_{q}"));
        }
        let mut l = db.connect();
        l.batch_execute(&format!("LISTEN \"{}\"", channel.replace('"', "\"\"")))
            .unwrap();
        c.query_one("SELECT pgque.enqueue($1, 'вид')", &[&q])
            .unwrap();
        let got = wait_until(std::time::Duration::from_secs(5), || {
            l.batch_execute("SELECT 1").unwrap();
            l.notifications().iter().next().ok().flatten().is_some()
        });
        assert!(got, "no NOTIFY on {channel}");
        let j = c
            .query(
                "SELECT job_id, lease_token FROM pgque.dispatch(ARRAY[$1], 5, 'работник')",
                &[&q],
            )
            .unwrap();
        assert_eq!(j.len(), 1);
        let ok: bool = c
            .query_one(
                "SELECT pgque.complete($1, $2)",
                &[&j[0].get::<_, i64>(0), &j[0].get::<_, i64>(1)],
            )
            .unwrap()
            .get(0);
        assert!(ok);
    }
}
