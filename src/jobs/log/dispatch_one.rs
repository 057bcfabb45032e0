//! Dispatch from one lane (the common call: its queues have one lane), with
//! the result rows assembled here instead of in SQL.
//!
//! Same answer as LOG_DISPATCH_SQL for one lane: the first `limit` jobs
//! above the lane's cursor in id order, claimed by one claim row, or
//! `blocked` (nothing claimed) when the call must merge with pgque.jobs.
//! Two small statements read the lane's state and its next log rows (whole,
//! with their arrays: LANE_STATE_SQL, and LANE_ROWS_SQL when those rows hold
//! too few jobs) and write the claim (CLAIM_SQL); the jobs are cut out of
//! the rows' arrays here. The single
//! statement this replaces unnested, materialised and sorted every job with
//! its args three times and started a plan of some forty nodes: a third of
//! a dispatch's time went into starting that plan and copying rows.
//!
//! Runs with the lane's dispatch lock held (LOCK_LANES_SQL), at READ
//! COMMITTED: each statement's snapshot is taken after the lock, so the
//! cursor read is the last committed one, and no other dispatcher moves it
//! before this one commits.
use super::dispatch::{
    CLAIM_SQL, LANE_ROWS_SQL, LANE_ROWS_SQL_V07, LANE_STATE_SQL, LANE_STATE_SQL_V07,
};
use super::jobrows::RawRow;
use super::stmt::{prepared, ty};
use pgrx::datum::{DatumWithOid, Interval};
use pgrx::pg_sys::{self, Datum};
use pgrx::prelude::*;
use pgrx::spi::SpiClient;

/// Log rows read per LANE_ROWS_SQL call at first: the rest of the row the
/// cursor is in, and the next one (with batches of `limit` jobs, the cursor
/// sits at a row boundary and one row is the whole dispatch).
const FIRST_ROWS: i64 = 2;
/// ... and at most this many per later call.
const MORE_ROWS: i64 = 64;

/// One log row read by LANE_ROWS_SQL, its arrays deconstructed.
struct LogRow {
    enqueued_at: Datum,
    max_attempts: Datum,
    ids: Vec<i64>,
    kinds: Elems,
    args: Elems,
    run_ats: Elems,
    max_attempts_of: Elems,
    fairness_keys: Elems,
    headers: Elems,
}

/// The elements of an array column (empty for a NULL array: every element
/// NULL). By-reference elements point into a copy of the array made in the
/// memory context that outlives the SPI connection.
#[derive(Default)]
struct Elems {
    values: Vec<Datum>,
    nulls: Vec<bool>,
}

impl Elems {
    fn get(&self, i: usize) -> Option<Datum> {
        match self.nulls.get(i) {
            Some(false) => Some(self.values[i]),
            _ => None,
        }
    }
}

/// The element layout of an array column's element type.
#[derive(Clone, Copy)]
struct Layout {
    oid: pg_sys::Oid,
    len: i32,
    byval: bool,
    align: u8,
}

const TEXT: Layout = Layout {
    oid: pg_sys::TEXTOID,
    len: -1,
    byval: false,
    align: b'i',
};
const JSONB: Layout = Layout {
    oid: pg_sys::JSONBOID,
    len: -1,
    byval: false,
    align: b'i',
};
const INT8: Layout = Layout {
    oid: pg_sys::INT8OID,
    len: 8,
    byval: true,
    align: b'd',
};
const TIMESTAMPTZ: Layout = Layout {
    oid: pg_sys::TIMESTAMPTZOID,
    len: 8,
    byval: true,
    align: b'd',
};
const INT4: Layout = Layout {
    oid: pg_sys::INT4OID,
    len: 4,
    byval: true,
    align: b'i',
};

/// Detoasts the array `d` (NULL: no elements) and deconstructs it. An array
/// of by-reference elements is first copied into the upper memory context
/// (SPI_datumTransfer), so its elements outlive the SPI connection.
unsafe fn elems(d: Datum, null: bool, l: Layout) -> Elems {
    if null {
        return Elems::default();
    }
    unsafe {
        let mut arr = pg_sys::pg_detoast_datum(d.cast_mut_ptr()) as *mut pg_sys::ArrayType;
        if !l.byval {
            arr = pg_sys::SPI_datumTransfer(Datum::from(arr), false, -1).cast_mut_ptr();
        }
        let mut values: *mut Datum = std::ptr::null_mut();
        let mut nulls: *mut bool = std::ptr::null_mut();
        let mut n: i32 = 0;
        pg_sys::deconstruct_array(
            arr,
            l.oid,
            l.len,
            l.byval,
            l.align as std::ffi::c_char,
            &mut values,
            &mut nulls,
            &mut n,
        );
        let n = n as usize;
        Elems {
            values: std::slice::from_raw_parts(values, n).to_vec(),
            nulls: std::slice::from_raw_parts(nulls, n).to_vec(),
        }
    }
}

/// A text value allocated in the upper memory context.
unsafe fn upper_text(s: &str) -> Datum {
    unsafe {
        let t =
            pg_sys::cstring_to_text_with_len(s.as_ptr() as *const std::ffi::c_char, s.len() as i32);
        pg_sys::SPI_datumTransfer(Datum::from(t), false, -1)
    }
}

/// Reads the log rows SPI_tuptable holds (LANE_ROWS_SQL's columns, from
/// column `at` on) into `rows`, in id order; returns how many there were and
/// the last one's id_hi.
unsafe fn read_rows(n: usize, at: usize, rows: &mut Vec<LogRow>) -> (usize, Option<i64>) {
    let seen = rows.len();
    let mut his: Vec<(i64, LogRow)> = Vec::with_capacity(n);
    unsafe {
        let tt = pg_sys::SPI_tuptable;
        if n == 0 || tt.is_null() {
            return (0, None);
        }
        let desc = (*tt).tupdesc;
        let mut all = [Datum::from(0); 17];
        let mut all_nl = [false; 17];
        for i in 0..n {
            pg_sys::heap_deform_tuple(
                *(*tt).vals.add(i),
                desc,
                all.as_mut_ptr(),
                all_nl.as_mut_ptr(),
            );
            let (v, nl) = (&all[at..at + 11], &all_nl[at..at + 11]);
            if nl[0] {
                continue; // LANE_STATE_SQL's row without a log row
            }
            let id_hi = v[0].value() as i64;
            let id_lo = v[1].value() as i64;
            let ids = if nl[4] {
                Vec::new()
            } else {
                elems(v[4], false, INT8)
                    .values
                    .iter()
                    .map(|d| d.value() as i64)
                    .collect()
            };
            let kinds = elems(v[5], nl[5], TEXT);
            let n_jobs = kinds.values.len();
            let ids = if ids.is_empty() {
                (0..n_jobs as i64).map(|k| id_lo + k).collect()
            } else {
                ids
            };
            his.push((
                id_hi,
                LogRow {
                    enqueued_at: v[2],
                    max_attempts: v[3],
                    ids,
                    kinds,
                    args: elems(v[6], nl[6], JSONB),
                    run_ats: elems(v[7], nl[7], TIMESTAMPTZ),
                    max_attempts_of: elems(v[8], nl[8], INT4),
                    fairness_keys: elems(v[9], nl[9], TEXT),
                    headers: elems(v[10], nl[10], JSONB),
                },
            ));
        }
    }
    // in id order whatever order the rows came in (LANE_STATE_SQL's come
    // through a join)
    his.sort_by_key(|h| h.0);
    let last = his.last().map(|h| h.0);
    rows.extend(his.into_iter().map(|h| h.1));
    (rows.len() - seen, last)
}

/// Dispatches up to `limit` jobs from `lane` into `out` (the caller holds
/// the lane's dispatch lock). Returns true, having claimed nothing, when the
/// call is blocked (the caller then spills and runs DISPATCH_SQL).
pub fn dispatch_one(
    client: &mut SpiClient<'_>,
    queues: &[String],
    lane: i32,
    limit: i32,
    worker: &str,
    lease: Option<Interval>,
    out: &mut Vec<RawRow>,
) -> bool {
    let (state_sql, rows_sql) = if crate::headers::job_log_has_headers() {
        (LANE_STATE_SQL, LANE_ROWS_SQL)
    } else {
        (LANE_STATE_SQL_V07, LANE_ROWS_SQL_V07)
    };
    let state = prepared(
        client,
        state_sql,
        &[
            ty(pg_sys::TEXTARRAYOID),
            ty(pg_sys::INT4OID),
            ty(pg_sys::TEXTOID),
            ty(pg_sys::INTERVALOID),
            ty(pg_sys::INT4ARRAYOID),
            ty(pg_sys::INT8OID),
        ],
    );
    let args: Vec<DatumWithOid<'_>> = vec![
        queues.to_vec().into(),
        limit.into(),
        worker.into(),
        lease.into(),
        vec![lane].into(),
        FIRST_ROWS.into(),
    ];
    let table = client
        .update(state, None, &args)
        .unwrap_or_else(|e| pgrx::error!("{e}"));
    let n = table.len();
    let row = table.first();
    if row.get::<bool>(1).ok().flatten().unwrap_or(false) {
        return true;
    }
    let (Some(queue), Some(priority), Some(lease), Some(cur)) = (
        row.get::<String>(3).ok().flatten(),
        row.get::<i16>(4).ok().flatten(),
        row.get::<Interval>(5).ok().flatten(),
        row.get::<i64>(6).ok().flatten(),
    ) else {
        // the lane's queue is paused
        return false;
    };
    let mut rows: Vec<LogRow> = Vec::new();
    let (mut got, mut last) = unsafe { read_rows(n, 6, &mut rows) };

    // more of the lane's rows until `limit` jobs above the cursor
    let mut found = 0usize;
    let mut ask = FIRST_ROWS;
    loop {
        found += rows[rows.len() - got..]
            .iter()
            .map(|r| r.ids.iter().filter(|&&id| id > cur).count())
            .sum::<usize>();
        let Some(after) = last else { break };
        if found >= limit as usize || (got as i64) < ask {
            break;
        }
        ask = MORE_ROWS.min((limit as usize - found) as i64);
        let rows_stmt = prepared(
            client,
            rows_sql,
            &[
                ty(pg_sys::INT4OID),
                ty(pg_sys::INT8OID),
                ty(pg_sys::INT8OID),
            ],
        );
        let table = client
            .update(rows_stmt, None, &[lane.into(), after.into(), ask.into()])
            .unwrap_or_else(|e| pgrx::error!("{e}"));
        (got, last) = unsafe { read_rows(table.len(), 0, &mut rows) };
    }

    // the first `limit` jobs above the cursor, in id order
    let mut cand: Vec<(i64, usize, usize)> = Vec::with_capacity(found);
    for (r, row) in rows.iter().enumerate() {
        for (k, &id) in row.ids.iter().enumerate() {
            if id > cur {
                cand.push((id, r, k));
            }
        }
    }
    cand.sort_unstable();
    cand.truncate(limit as usize);
    let Some(&(hi, _, _)) = cand.last() else {
        return false;
    };
    let job_ids: Vec<i64> = cand.iter().map(|c| c.0).collect();
    let claim = prepared(
        client,
        CLAIM_SQL,
        &[
            ty(pg_sys::INT4OID),
            ty(pg_sys::INT8OID),
            ty(pg_sys::INT8ARRAYOID),
            ty(pg_sys::TEXTOID),
            ty(pg_sys::INTERVALOID),
        ],
    );
    let made = client
        .update(
            claim,
            None,
            &[
                lane.into(),
                hi.into(),
                job_ids.into(),
                worker.into(),
                lease.into(),
            ],
        )
        .unwrap_or_else(|e| pgrx::error!("{e}"))
        .first();
    let token = made.get::<i64>(1).ok().flatten().expect("a claim row");
    let until = made
        .get::<TimestampWithTimeZone>(2)
        .ok()
        .flatten()
        .expect("a lease end");

    let queue = unsafe { upper_text(&queue) };
    let until = until.into_datum().expect("a timestamp");
    out.reserve(cand.len());
    for (id, r, k) in cand {
        let row = &rows[r];
        let mut v = [Datum::from(0); 15];
        let mut nl = [false; 15];
        v[0] = Datum::from(id);
        v[1] = queue;
        match row.kinds.get(k) {
            Some(d) => v[2] = d,
            None => nl[2] = true,
        }
        match row.args.get(k) {
            Some(d) => v[3] = d,
            None => nl[3] = true,
        }
        v[4] = Datum::from(priority);
        v[5] = Datum::from(1i32);
        v[6] = row.max_attempts_of.get(k).unwrap_or(row.max_attempts);
        nl[7] = true;
        match row.fairness_keys.get(k) {
            Some(d) => v[8] = d,
            None => nl[8] = true,
        }
        nl[9] = true;
        v[10] = row.run_ats.get(k).unwrap_or(row.enqueued_at);
        v[11] = row.enqueued_at;
        v[12] = Datum::from(token);
        v[13] = until;
        match row.headers.get(k) {
            Some(d) => v[14] = d,
            None => nl[14] = true,
        }
        out.push((v, nl));
    }
    false
}
