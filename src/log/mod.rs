//! The event-log engine: queues with rotating append-only event tables,
//! ticks, batches, consumer positions, retries, rotation.
//!
//! Everything here runs SQL through [`exec`], which prepares each distinct
//! statement once per backend and keeps the plan (SPI_keepplan). Statements
//! that name a queue's event table embed the queue id (an integer, never user
//! input) in the text, so the cache holds one plan per (statement, queue).
//! PostgreSQL's plan cache revalidates a kept plan when a table it uses is
//! dropped and recreated (DROP / CREATE EXTENSION in the same backend), so a
//! cached plan never points at a dead relation.
use crate::error::{self, raise};
use pgrx::datum::DatumWithOid;
use pgrx::pg_sys::PgOid;
use pgrx::prelude::*;
use pgrx::spi::{OwnedPreparedStatement, SpiClient, SpiHeapTupleData, SpiTupleTable};
use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;

pub mod batch;
pub mod cuts;
pub mod direct;
pub mod jsontext;
pub mod look;
pub mod maint;
pub mod pause;
pub mod qlookup;
pub mod resize;
pub mod slots;
pub mod tick;

extension_sql_file!(
    "../../sql/10_event_log.sql",
    name = "event_log",
    requires = ["bootstrap"]
);

/// Most statements kept per backend. Statements that embed a queue id are
/// per queue, so a backend touching very many queues would otherwise keep
/// plans without bound; past the limit the cache starts over.
const MAX_PLANS: usize = 2_000;

/// A kept plan and whether its statement only reads ([`reads_only`], decided
/// once when the statement is prepared, not on every execution).
#[derive(Clone)]
struct Kept {
    plan: Rc<OwnedPreparedStatement>,
    reads_only: bool,
}

thread_local! {
    static PLANS: RefCell<HashMap<String, Kept>> = RefCell::new(HashMap::new());
}

fn plan(client: &SpiClient<'_>, sql: &str, args: &[DatumWithOid]) -> Kept {
    if let Some(k) = PLANS.with(|m| m.borrow().get(sql).cloned()) {
        return k;
    }
    let types: Vec<PgOid> = args.iter().map(|a| PgOid::from(a.oid())).collect();
    let prepared = Rc::new(
        client
            .prepare_mut(sql, &types)
            .unwrap_or_else(|e| panic!("pgque: cannot prepare statement: {e}"))
            .keep(),
    );
    let kept = Kept {
        plan: prepared,
        reads_only: reads_only(sql),
    };
    PLANS.with(|m| {
        let mut m = m.borrow_mut();
        if m.len() >= MAX_PLANS {
            m.clear();
        }
        m.insert(sql.to_string(), kept.clone());
    });
    kept
}

/// Runs `sql` (prepared once per backend) with `args`; the parameter types are
/// the args' types, so always pass the same Rust types for one statement.
///
/// A statement that only reads ([`reads_only`]) runs through SPI's read path:
/// pgrx's write path assigns the transaction an id first, so every idle
/// receive poll and every info call used to burn an xid and write (and, with
/// synchronous_commit on, flush) a commit record. Read-only, it uses the
/// calling statement's snapshot until the transaction has written something
/// (pgrx switches to fresh snapshots from then on), which is what the
/// lock-then-re-read paths need: the lock is a write.
pub fn exec<'c>(client: &mut SpiClient<'c>, sql: &str, args: &[DatumWithOid]) -> SpiTupleTable<'c> {
    let k = plan(client, sql, args);
    let result = if k.reads_only {
        client.select(&*k.plan, None, args)
    } else {
        client.update(&*k.plan, None, args)
    };
    result.unwrap_or_else(|e| panic!("pgque: statement failed: {e}"))
}

/// Like [`exec`], always on SPI's read path: for statements [`reads_only`]
/// cannot prove read-only (a WITH of plain SELECTs) but that are.
pub fn exec_read<'c>(
    client: &mut SpiClient<'c>,
    sql: &str,
    args: &[DatumWithOid],
) -> SpiTupleTable<'c> {
    let k = plan(client, sql, args);
    client
        .select(&*k.plan, None, args)
        .unwrap_or_else(|e| panic!("pgque: statement failed: {e}"))
}

/// A plain SELECT: no row locks, no data-modifying CTE (those start with
/// WITH), no call that writes (sequences, NOTIFY, advisory locks, pgque's own
/// functions). Conservative: anything else is run as a write.
pub fn reads_only(sql: &str) -> bool {
    let s = sql.trim_start().to_ascii_lowercase();
    if !s.starts_with("select") {
        return false;
    }
    const WRITES: [&str; 9] = [
        " for update",
        " for no key update",
        " for share",
        " for key share",
        "nextval(",
        "setval(",
        "pg_notify(",
        "pg_advisory",
        "pg_current_xact_id()",
    ];
    if WRITES.iter().any(|w| s.contains(w)) {
        return false;
    }
    // a call of a pgque function (tables are pgque.<name> without a parenthesis)
    !s.match_indices("pgque.").any(|(i, _)| {
        let rest = &s[i + "pgque.".len()..];
        let name_len = rest
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(rest.len());
        rest[name_len..].trim_start().starts_with('(')
    })
}

/// Takes an ACCESS EXCLUSIVE lock on table `pgque.<table>` if it is free now
/// (never waits); false if someone holds a conflicting lock. For TRUNCATEs
/// that must not stall a worker behind a reader.
pub fn try_lock_exclusive(table: &str) -> bool {
    let name = std::ffi::CString::new(table).expect("table name without NUL");
    unsafe {
        let ns = pg_sys::get_namespace_oid(c"pgque".as_ptr(), false);
        let relid = pg_sys::get_relname_relid(name.as_ptr(), ns);
        relid != pg_sys::InvalidOid
            && pg_sys::ConditionalLockRelationOid(relid, pg_sys::AccessExclusiveLock as _)
    }
}

/// Runs a one-off statement (DDL), not cached.
pub fn run_once(client: &mut SpiClient<'_>, sql: &str) {
    client
        .update(sql, None, &[])
        .unwrap_or_else(|e| panic!("pgque: statement failed: {e}"));
}

/// Typed column of a row (1-based), NULL as None.
pub fn col<T: FromDatum + IntoDatum>(row: &SpiHeapTupleData<'_>, n: usize) -> Option<T> {
    row.get::<T>(n)
        .unwrap_or_else(|e| panic!("pgque: column {n}: {e}"))
}

/// The first row of a result, if any.
pub fn first_row<'c>(t: SpiTupleTable<'c>) -> Option<SpiHeapTupleData<'c>> {
    t.into_iter().next()
}

/// Whether the 0.7.0 dead-letter storage exists (`pgque.dead_letter_store`,
/// with the ev_txid columns of it and of retry_queue). Between installing
/// this library and `ALTER EXTENSION pgque UPDATE` a database still has the
/// older schema (dead letters in the table `pgque.dead_letter`), and nack,
/// replay and purge must keep working there. A syscache lookup, no SQL.
pub fn dead_letter_store_installed() -> bool {
    unsafe {
        let ns = pg_sys::get_namespace_oid(c"pgque".as_ptr(), true);
        ns != pg_sys::InvalidOid
            && pg_sys::get_relname_relid(c"dead_letter_store".as_ptr(), ns) != pg_sys::InvalidOid
    }
}

/// The table dead letters are stored in (see [`dead_letter_store_installed`]).
pub fn dead_letter_table() -> &'static str {
    if dead_letter_store_installed() {
        "pgque.dead_letter_store"
    } else {
        "pgque.dead_letter"
    }
}

/// `, ev_headers` where the schema has the event headers
/// ([`crate::headers::events_have_headers`]), else nothing: appended to the
/// column lists of the statements that move events between the event
/// tables, retries, dead letters, held and delayed events, so each move
/// carries an event's headers (and works unchanged on an older schema).
pub fn headers_col() -> &'static str {
    if crate::headers::events_have_headers() {
        ", ev_headers"
    } else {
        ""
    }
}

/// What the engine knows about a queue for sending and consuming.
#[derive(Debug, Clone)]
pub struct Queue {
    pub id: i32,
    pub name: String,
    pub cur_table: i32,
    pub ntables: i32,
    pub max_retries: i32,
    /// The queue's event id sequence (send_batch draws its ids from it).
    pub seq: pg_sys::Oid,
}

impl Queue {
    pub fn parent_table(&self) -> String {
        event_parent(self.id)
    }
    pub fn current_table(&self) -> String {
        event_table(self.id, self.cur_table)
    }
}

pub fn event_parent(qid: i32) -> String {
    format!("pgque.event_{qid}")
}
pub fn event_table(qid: i32, n: i32) -> String {
    format!("pgque.event_{qid}_{n}")
}
pub fn event_seq(qid: i32) -> String {
    format!("pgque.event_{qid}_id_seq")
}

/// Looks a queue up by name: 22004 for NULL, 42602/42622 for a bad name,
/// 42704 when there is no such queue.
pub fn queue_by_name(client: &mut SpiClient<'_>, name: Option<&str>) -> Queue {
    let name = error::valid_name(name, "queue_name", error::MAX_QUEUE_NAME);
    find_queue(client, name).unwrap_or_else(|| {
        raise(
            error::UNDEFINED_OBJECT,
            format!("queue not found: {name:?}"),
        )
    })
}

pub fn find_queue(client: &mut SpiClient<'_>, name: &str) -> Option<Queue> {
    let t = exec(
        client,
        "SELECT queue_id, queue_cur_table, queue_ntables, queue_max_retries, \
                queue_event_seq::pg_catalog.oid \
           FROM pgque.queue WHERE queue_name OPERATOR(pg_catalog.=) $1",
        &[name.into()],
    );
    first_row(t).map(|r| Queue {
        id: col(&r, 1).unwrap(),
        name: name.to_string(),
        cur_table: col(&r, 2).unwrap(),
        ntables: col(&r, 3).unwrap(),
        max_retries: col(&r, 4).unwrap(),
        seq: col(&r, 5).unwrap(),
    })
}

/// The raw fields of one event to append.
#[derive(Debug, Default, Clone)]
pub struct NewEvent<'a> {
    pub ev_type: Option<&'a str>,
    pub ev_data: Option<&'a str>,
    pub extra: [Option<&'a str>; 4],
    /// ev_headers (checked by the caller: crate::headers::check_headers).
    pub headers: Option<batch::PgJsonb>,
}

/// The queue named `queue_name` for a send, found below SQL ([`qlookup`])
/// where that can be done (42704 when there is no such queue); None when
/// the caller must look it up by SQL ([`queue_by_name`]).
fn send_queue(name: &str) -> Option<Queue> {
    qlookup::find(name).map(|found| {
        found.unwrap_or_else(|| {
            raise(
                error::UNDEFINED_OBJECT,
                format!("queue not found: {name:?}"),
            )
        })
    })
}

/// send / insert_event: appends one event to the queue named `queue_name`
/// (checked and looked up as [`queue_by_name`] does); returns its id. A
/// send that needs no SQL (the queue found by [`qlookup`], the row written
/// by [`direct`]) opens no SPI connection.
pub fn send_event(queue_name: Option<&str>, ev: &NewEvent<'_>) -> i64 {
    let name = error::valid_name(queue_name, "queue_name", error::MAX_QUEUE_NAME);
    match send_queue(name) {
        Some(q) => insert_event_direct(&q, ev)
            .unwrap_or_else(|| Spi::connect_mut(|c| insert_event_sql(c, &q, ev))),
        None => Spi::connect_mut(|c| {
            let q = queue_by_name(c, Some(name));
            insert_event(c, &q, ev)
        }),
    }
}

/// send_batch: [`insert_events`] (headers on every event) into the queue named `queue_name`, with
/// no SPI connection when none is needed (as [`send_event`]).
pub fn send_events(
    queue_name: Option<&str>,
    ev_type: &str,
    payloads: &crate::api::types::ArrayDatum,
    keys: Option<&crate::api::types::ArrayDatum>,
    headers: Option<batch::PgJsonb>,
) -> Vec<i64> {
    let name = error::valid_name(queue_name, "queue_name", error::MAX_QUEUE_NAME);
    match send_queue(name) {
        Some(_) if payloads.len == 0 => vec![],
        Some(q) => match insert_events_direct(&q, ev_type, payloads, keys, headers) {
            Some(ids) => {
                crate::worker::wake::at_commit();
                ids
            }
            None => Spi::connect_mut(|c| insert_events(c, &q, ev_type, payloads, keys, headers)),
        },
        None => Spi::connect_mut(|c| {
            let q = queue_by_name(c, Some(name));
            insert_events(c, &q, ev_type, payloads, keys, headers)
        }),
    }
}

/// Appends one event to the queue's current table; returns its id.
pub fn insert_event<'a>(client: &mut SpiClient<'_>, q: &Queue, ev: &NewEvent<'a>) -> i64 {
    insert_event_direct(q, ev).unwrap_or_else(|| insert_event_sql(client, q, ev))
}

/// [`insert_event`] below SQL ([`direct`]); None when the table needs the
/// SQL INSERT.
fn insert_event_direct<'a>(q: &Queue, ev: &NewEvent<'a>) -> Option<i64> {
    let mut t = direct::Target::open(q, 1, ev.headers.is_some())?;
    let id = nextval(q.seq);
    let v = |s: Option<&'a str>| s.map_or(direct::Val::Null, direct::Val::Str);
    t.push(
        id,
        v(ev.ev_type),
        v(ev.ev_data),
        [
            v(ev.extra[0]),
            v(ev.extra[1]),
            v(ev.extra[2]),
            v(ev.extra[3]),
        ],
        ev.headers.map(batch::PgJsonb::datum),
    );
    t.finish();
    crate::worker::wake::at_commit();
    Some(id)
}

/// [`insert_event`] by the SQL INSERT.
fn insert_event_sql(client: &mut SpiClient<'_>, q: &Queue, ev: &NewEvent<'_>) -> i64 {
    if let Some(h) = ev.headers {
        // A traced event on a table the direct path does not write: the
        // statement below with the headers (an untraced one stays as it is).
        let sql = format!(
            "INSERT INTO {} (ev_id, ev_type, ev_data, ev_extra1, ev_extra2, ev_extra3, ev_extra4, ev_headers) \
             VALUES (pg_catalog.nextval('{}'::pg_catalog.regclass), $1, $2, $3, $4, $5, $6, $7) \
             RETURNING ev_id",
            q.current_table(),
            event_seq(q.id)
        );
        let t = exec(
            client,
            &sql,
            &[
                ev.ev_type.into(),
                ev.ev_data.into(),
                ev.extra[0].into(),
                ev.extra[1].into(),
                ev.extra[2].into(),
                ev.extra[3].into(),
                h.into(),
            ],
        );
        crate::worker::wake::at_commit();
        return col(&first_row(t).expect("INSERT RETURNING"), 1).unwrap();
    }
    let sql = format!(
        "INSERT INTO {} (ev_id, ev_type, ev_data, ev_extra1, ev_extra2, ev_extra3, ev_extra4) \
         VALUES (pg_catalog.nextval('{}'::pg_catalog.regclass), $1, $2, $3, $4, $5, $6) \
         RETURNING ev_id",
        q.current_table(),
        event_seq(q.id)
    );
    let t = exec(
        client,
        &sql,
        &[
            ev.ev_type.into(),
            ev.ev_data.into(),
            ev.extra[0].into(),
            ev.extra[1].into(),
            ev.extra[2].into(),
            ev.extra[3].into(),
        ],
    );
    crate::worker::wake::at_commit();
    col(&first_row(t).expect("INSERT RETURNING"), 1).unwrap()
}

/// Appends many events of one type in one statement; ids come back aligned
/// with the input positions. `payloads` is a `jsonb[]` or `text[]` datum
/// (cast to text by the statement); `keys` (partition keys, into ev_extra1)
/// must be as long as `payloads` (the caller checks); `headers` go with
/// every event of the call.
///
/// The ids are drawn from the queue's sequence here, one nextval per event
/// in input order as the statement would draw them, and handed to the INSERT
/// as a third array: the statement returns nothing, so no RETURNING rows are
/// projected, stored by SPI and read back (about a tenth of a 100-event call).
pub fn insert_events(
    client: &mut SpiClient<'_>,
    q: &Queue,
    ev_type: &str,
    payloads: &crate::api::types::ArrayDatum,
    keys: Option<&crate::api::types::ArrayDatum>,
    headers: Option<batch::PgJsonb>,
) -> Vec<i64> {
    if payloads.len == 0 {
        return vec![];
    }
    if let Some(ids) = insert_events_direct(q, ev_type, payloads, keys, headers) {
        crate::worker::wake::at_commit();
        return ids;
    }
    let cast = if payloads.type_oid == pg_sys::JSONBARRAYOID {
        "jsonb[]"
    } else {
        "text[]"
    };
    // Keyed or not, one statement: unnest of a NULL keys array yields no
    // rows, and ROWS FROM pads the shorter side with NULLs. Every name is
    // schema-qualified: the send path runs with the caller's search_path
    // (crate::api::owner); so is find_queue's and insert_event's.
    // Headers, when given, are a fifth parameter of another statement: an
    // untraced call runs the same one as before headers existed.
    let (hcol, hval) = if headers.is_some() {
        (", ev_headers", ", $5::pg_catalog.jsonb")
    } else {
        ("", "")
    };
    let sql = format!(
        "INSERT INTO {tbl} (ev_id, ev_type, ev_data, ev_extra1{hcol}) \
         SELECT u.i, $1, u.p::pg_catalog.text, u.k{hval} \
           FROM ROWS FROM (pg_catalog.unnest($4::pg_catalog.int8[]), \
                           pg_catalog.unnest($2::pg_catalog.{cast}), \
                           pg_catalog.unnest($3::pg_catalog.text[])) AS u(i, p, k)",
        tbl = q.current_table()
    );
    let ids: Vec<i64> = (0..payloads.len).map(|_| nextval(q.seq)).collect();
    let keys = keys.map_or(
        pgrx::datum::DatumWithOid::null_oid(pg_sys::TEXTARRAYOID),
        |k| k.arg(),
    );
    let id_arg = pgrx::datum::DatumWithOid::from(ids.as_slice());
    let mut args = vec![ev_type.into(), payloads.arg(), keys, id_arg];
    if let Some(h) = headers {
        args.push(h.into());
    }
    exec(client, &sql, &args);
    crate::worker::wake::at_commit();
    ids
}

/// [`insert_events`] below SQL ([`direct`]); None when the table needs the
/// SQL INSERT. A jsonb payload is stored as its text (`jsonb::text`).
fn insert_events_direct(
    q: &Queue,
    ev_type: &str,
    payloads: &crate::api::types::ArrayDatum,
    keys: Option<&crate::api::types::ArrayDatum>,
    headers: Option<batch::PgJsonb>,
) -> Option<Vec<i64>> {
    // made before open: they outlive its chunk context
    let jsonb = payloads.type_oid == pg_sys::JSONBARRAYOID;
    let elem = if jsonb {
        pg_sys::JSONBOID
    } else {
        pg_sys::TEXTOID
    };
    let (p, pn) = unsafe { payloads.elements(elem) };
    let k = keys.map(|k| unsafe { k.elements(pg_sys::TEXTOID) });
    let ty = direct::Val::Datum(direct::text_datum(ev_type));
    let mut t = direct::Target::open(q, payloads.len, headers.is_some())?;
    let h = headers.map(batch::PgJsonb::datum);
    let mut scratch = Vec::new();
    let mut ids = Vec::with_capacity(p.len());
    for i in 0..p.len() {
        // the sequence's ACL is checked with the first id, not for each
        let id = if i == 0 {
            nextval(q.seq)
        } else {
            nextval_unchecked(q.seq)
        };
        ids.push(id);
        let data = match (pn[i], jsonb) {
            (true, _) => direct::Val::Null,
            (false, true) => direct::Val::Datum(direct::jsonb_text(p[i], &mut scratch)),
            (false, false) => direct::Val::Datum(p[i]),
        };
        let key = match &k {
            Some((kv, kn)) if i < kv.len() && !kn[i] => direct::Val::Datum(kv[i]),
            _ => direct::Val::Null,
        };
        t.push(
            id,
            ty,
            data,
            [key, direct::Val::Null, direct::Val::Null, direct::Val::Null],
            h,
        );
    }
    t.finish();
    Some(ids)
}

/// The next value of sequence `seq` (the caller owns it: the send path runs
/// as the extension's owner).
fn nextval(seq: pg_sys::Oid) -> i64 {
    unsafe { pgrx::direct_function_call::<i64>(pg_sys::nextval_oid, &[seq.into_datum()]) }
        .expect("nextval returned NULL")
}

unsafe extern "C-unwind" {
    /// sequence.c's nextval, exported by the server (commands/sequence.h
    /// in every supported major): `check_permissions` false skips the ACL
    /// lookup, as the executor's nextval of a column default does.
    fn nextval_internal(relid: pg_sys::Oid, check_permissions: bool) -> i64;
}

/// [`nextval`] without the ACL check, for the second and later ids of one
/// call (1% of a 100-event send_batch's CPU was checking it again). An
/// error it raises (the sequence exhausted) becomes a Rust panic at the
/// boundary, as with pg_sys's own functions.
fn nextval_unchecked(seq: pg_sys::Oid) -> i64 {
    unsafe { pg_sys::ffi::pg_guard_ffi_boundary(|| nextval_internal(seq, false)) }
}

/// Creates a queue with its event tables and first tick; false if it exists.
pub fn create_queue(client: &mut SpiClient<'_>, name: &str) -> bool {
    let t = exec(
        client,
        "INSERT INTO pgque.queue (queue_name, queue_event_seq) VALUES ($1, 0) \
         ON CONFLICT (queue_name) DO NOTHING RETURNING queue_id, queue_ntables",
        &[name.into()],
    );
    let Some(r) = first_row(t) else {
        return false;
    };
    let qid: i32 = col(&r, 1).unwrap();
    let ntables: i32 = col(&r, 2).unwrap();
    let parent = event_parent(qid);
    let seq = event_seq(qid);
    // Objects of this id can only be leftovers of an earlier installation
    // (DROP EXTENSION leaves the tables create_queue made): remove them.
    let t = exec(
        client,
        "SELECT to_regclass($1) IS NOT NULL, to_regclass($2) IS NOT NULL",
        &[parent.as_str().into(), seq.as_str().into()],
    );
    let r = first_row(t).unwrap();
    let (old_tables, old_seq): (bool, bool) = (col(&r, 1).unwrap(), col(&r, 2).unwrap());
    if old_tables {
        run_once(client, &format!("DROP TABLE {parent} CASCADE"));
    }
    if old_seq {
        run_once(client, &format!("DROP SEQUENCE {seq}"));
    }
    run_once(client, &format!("CREATE SEQUENCE {seq}"));
    run_once(
        client,
        &format!(
            "CREATE TABLE {parent} (
                ev_id     bigint NOT NULL,
                ev_time   timestamptz NOT NULL DEFAULT now(),
                ev_txid   xid8 NOT NULL DEFAULT pg_current_xact_id(),
                ev_owner  int4,
                ev_retry  int4,
                ev_type   text,
                ev_data   text,
                ev_extra1 text,
                ev_extra2 text,
                ev_extra3 text,
                ev_extra4 text,
                ev_headers jsonb)"
        ),
    );
    for n in 0..ntables {
        let child = event_table(qid, n);
        run_once(
            client,
            &format!("CREATE TABLE {child} () INHERITS ({parent}) WITH (fillfactor = 100)"),
        );
        run_once(
            client,
            &format!("CREATE INDEX event_{qid}_{n}_txid_idx ON {child} (ev_txid)"),
        );
    }
    exec(
        client,
        "UPDATE pgque.queue SET queue_event_seq = $2::regclass::oid WHERE queue_id = $1",
        &[qid.into(), seq.as_str().into()],
    );
    tick::insert_tick(client, qid, name, 0, tick::Pending::None);
    true
}

/// Drops a queue, its tables and its metadata.
pub fn drop_queue(client: &mut SpiClient<'_>, q: &Queue, force: bool) {
    let t = exec(
        client,
        "SELECT count(*) FROM pgque.subscription WHERE sub_queue = $1",
        &[q.id.into()],
    );
    let subs: i64 = col(&first_row(t).unwrap(), 1).unwrap();
    // Lock order, before anything is deleted: the queue row, as the ticker
    // and the maintenance duties take it (they skip a locked queue), then
    // the event tables through their parent, parent first and children
    // after, as every reader through the parent locks them. Dropping the
    // children first instead deadlocked with a worker duty that had locked
    // the parent and was expanding to the children (seen in benches w12).
    exec(
        client,
        "SELECT 1 FROM pgque.queue WHERE queue_id = $1 FOR NO KEY UPDATE",
        &[q.id.into()],
    );
    run_once(
        client,
        &format!("LOCK TABLE {} IN ACCESS EXCLUSIVE MODE", event_parent(q.id)),
    );
    if subs > 0 && !force {
        raise(
            error::WRONG_STATE,
            format!(
                "queue {:?} has {subs} consumer(s); unsubscribe them or call drop_queue(queue_name, true)",
                q.name
            ),
        );
    }
    exec(
        client,
        "DELETE FROM pgque.batch WHERE sub_id IN (SELECT sub_id FROM pgque.subscription WHERE sub_queue = $1)",
        &[q.id.into()],
    );
    exec(
        client,
        "DELETE FROM pgque.tick WHERE tick_queue = $1",
        &[q.id.into()],
    );
    exec(
        client,
        "DELETE FROM pgque.retry_queue WHERE ev_queue = $1",
        &[q.id.into()],
    );
    exec(
        client,
        &format!("DELETE FROM {} WHERE dl_queue = $1", dead_letter_table()),
        &[q.id.into()],
    );
    exec(
        client,
        "DELETE FROM pgque.queue WHERE queue_id = $1",
        &[q.id.into()],
    );
    // Children first, then the parent: no CASCADE, no NOTICE.
    let children: Vec<String> = (0..q.ntables).map(|n| event_table(q.id, n)).collect();
    run_once(
        client,
        &format!("DROP TABLE {}, {}", children.join(", "), event_parent(q.id)),
    );
    run_once(client, &format!("DROP SEQUENCE {}", event_seq(q.id)));
}

/// A consumer's subscription row.
#[derive(Debug, Clone)]
pub struct Sub {
    pub id: i32,
    pub name: String,
}

/// Checks a plain consumer name: like any name, and no `#` (it separates
/// slot and subconsumer names).
pub fn valid_consumer<'a>(name: Option<&'a str>, what: &str) -> &'a str {
    let name = error::valid_name(name, what, error::MAX_CONSUMER_NAME);
    if name.contains('#') {
        raise(
            error::INVALID_NAME,
            format!("{what} {name:?} must not contain '#'"),
        );
    }
    name
}

pub fn find_sub(client: &mut SpiClient<'_>, q: &Queue, consumer: &str) -> Option<Sub> {
    let t = exec(
        client,
        "SELECT sub_id FROM pgque.subscription \
          WHERE sub_queue = $1 AND sub_parent IS NULL AND sub_consumer = $2",
        &[q.id.into(), consumer.into()],
    );
    first_row(t).map(|r| Sub {
        id: col(&r, 1).unwrap(),
        name: consumer.to_string(),
    })
}

pub fn sub_by_name(client: &mut SpiClient<'_>, q: &Queue, consumer: Option<&str>) -> Sub {
    let consumer = valid_consumer(consumer, "consumer");
    find_sub(client, q, consumer).unwrap_or_else(|| {
        raise(
            error::UNDEFINED_OBJECT,
            format!(
                "consumer not registered: {consumer:?} on queue {:?}",
                q.name
            ),
        )
    })
}

/// 54000 unless queue `q` has room for `adding` more consumers (rows of
/// pgque.subscription: plain consumers, slots, cooperative members) under
/// pgque.max_consumers_per_queue. Registration is rare; the count reads the
/// queue's subscriptions, which the bound keeps few.
pub fn check_consumer_room(client: &mut SpiClient<'_>, q: &Queue, adding: i64) {
    let t = exec(
        client,
        "SELECT count(*) FROM pgque.subscription WHERE sub_queue = $1",
        &[q.id.into()],
    );
    let have: i64 = first_row(t).and_then(|r| col(&r, 1)).unwrap_or(0);
    let max = crate::gucs::max_consumers_per_queue();
    if have + adding > max {
        error::raise_detail(
            error::LIMIT_EXCEEDED,
            format!(
                "queue {:?} has {have} consumers; {adding} more would pass pgque.max_consumers_per_queue ({max})",
                q.name
            ),
            "Each slot of a partitioned consumer and each cooperative member counts. Unregister unused consumers, or have a superuser raise the setting.",
        );
    }
}

/// Registers a consumer at `tick` (default: the queue's last tick).
/// Returns false when it was registered already.
pub fn register(
    client: &mut SpiClient<'_>,
    q: &Queue,
    consumer: &str,
    at_tick: Option<i64>,
) -> bool {
    if find_sub(client, q, consumer).is_some() {
        return false;
    }
    if slots::consumer_n(client, q, consumer).is_some() {
        raise(
            error::DUPLICATE_OBJECT,
            format!(
                "{consumer:?} is a partitioned consumer of queue {:?}; a plain consumer needs its own name",
                q.name
            ),
        );
    }
    check_consumer_room(client, q, 1);
    let tick = match at_tick {
        Some(t) => {
            if tick::tick_snapshot(client, q.id, t).is_none() {
                raise(
                    error::UNDEFINED_OBJECT,
                    format!("tick {t} of queue {:?} does not exist (any more)", q.name),
                );
            }
            t
        }
        None => tick::last_tick(client, q.id)
            .map(|t| t.id)
            .unwrap_or_else(|| tick::insert_tick(client, q.id, &q.name, 0, tick::Pending::None)),
    };
    exec(
        client,
        "INSERT INTO pgque.subscription (sub_queue, sub_consumer, sub_start_tick) VALUES ($1, $2, $3) \
         ON CONFLICT DO NOTHING",
        &[q.id.into(), consumer.into(), tick.into()],
    );
    true
}

/// Removes a consumer (with its cooperative members and pending retries).
pub fn unregister(client: &mut SpiClient<'_>, q: &Queue, sub: &Sub) {
    exec(
        client,
        "DELETE FROM pgque.retry_queue WHERE ev_owner = $1",
        &[sub.id.into()],
    );
    exec(
        client,
        "DELETE FROM pgque.subscription WHERE sub_id = $1 OR sub_parent = $1",
        &[sub.id.into()],
    );
    let _ = q;
}

#[cfg(test)]
mod pure_tests {
    use super::reads_only;

    #[test]
    fn plain_selects_read_only() {
        assert!(reads_only(
            "SELECT queue_id FROM pgque.queue WHERE queue_name = $1"
        ));
        assert!(reads_only(
            "  select coalesce(pg_sequence_last_value(q.queue_event_seq::regclass), 0) FROM pgque.queue q"
        ));
        assert!(reads_only(
            "SELECT b.batch_id FROM pgque.batch b JOIN pgque.subscription s ON s.sub_id = b.sub_id"
        ));
    }

    #[test]
    fn writes_locks_and_writing_calls_are_not() {
        assert!(!reads_only("INSERT INTO pgque.tick VALUES (1)"));
        assert!(!reads_only(
            "WITH u AS (UPDATE pgque.queue SET x = 1 RETURNING 1) SELECT 1"
        ));
        assert!(!reads_only(
            "SELECT 1 FROM pgque.subscription WHERE sub_id = $1 FOR NO KEY UPDATE"
        ));
        assert!(!reads_only("SELECT x FROM t FOR UPDATE SKIP LOCKED"));
        assert!(!reads_only("SELECT x FROM t FOR KEY SHARE"));
        assert!(!reads_only("SELECT nextval('pgque.batch_id_seq')"));
        assert!(!reads_only("SELECT pg_notify('c', 'p')"));
        assert!(!reads_only("SELECT pg_advisory_xact_lock(1)"));
        assert!(!reads_only("SELECT pgque.ticker()"));
        assert!(!reads_only("SELECT * FROM pgque.partition_slot_rows ()"));
        assert!(!reads_only("SELECT pg_current_xact_id()"));
    }
}
