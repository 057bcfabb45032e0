//! How the event engine runs SQL: [`exec`] prepares each distinct statement
//! once per backend and keeps the plan (SPI_keepplan). Statements that name a
//! queue's event table embed the queue id (an integer, never user input) in
//! the text, so the cache holds one plan per (statement, queue). PostgreSQL's
//! plan cache revalidates a kept plan when a table it uses is dropped and
//! recreated (DROP / CREATE EXTENSION in the same backend), so a cached plan
//! never points at a dead relation. Everything in `log/` stands on this.
use pgrx::datum::DatumWithOid;
use pgrx::pg_sys::PgOid;
use pgrx::prelude::*;
use pgrx::spi::{OwnedPreparedStatement, SpiClient, SpiHeapTupleData, SpiTupleTable};
use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;

/// Most statements kept per backend. Statements that embed a queue id are
/// per queue, so a backend touching very many queues would otherwise keep
/// plans without bound; past the limit the cache starts over.
const MAX_PLANS: usize = 2_000;

/// A kept plan and whether its statement only reads ([`reads_only`], decided
/// once when the statement is prepared, not on every execution).
#[derive(Clone)]
pub(super) struct Kept {
    pub(super) plan: Rc<OwnedPreparedStatement>,
    reads_only: bool,
}

thread_local! {
    static PLANS: RefCell<HashMap<String, Kept>> = RefCell::new(HashMap::new());
}

pub(super) fn plan(client: &SpiClient<'_>, sql: &str, args: &[DatumWithOid]) -> Kept {
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

#[cfg(test)]
mod tests {
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
