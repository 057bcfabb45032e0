//! Appending events below SQL: the rows of a send go into the queue's
//! current event table with `heap_multi_insert` (one WAL record per page
//! instead of one per row) and their index entries with
//! `ExecInsertIndexTuples`, as COPY FROM does, with no statement to plan,
//! no executor, no unnest of the payload arrays and no SPI.
//!
//! It writes exactly the row the SQL INSERT writes (the event tables'
//! defaults, `now()` and `pg_current_xact_id()`, filled in here) and is
//! used only where the SQL INSERT would do nothing more: the table has the
//! event layout and no triggers, rules, CHECK constraints, row security or
//! deferred unique indexes, and the transaction may write. Otherwise
//! [`Target::open`] returns None and the caller runs the SQL INSERT, which
//! applies (or refuses) whatever the table has.
use super::queue::Queue;
use pgrx::pg_sys;
use std::ffi::CString;

/// The event tables' columns, in order: name and type. ev_headers came
/// with 0.8.0: a table without it (a schema not updated yet) is written
/// too, with the first 11.
const LAYOUT: [(&str, pg_sys::Oid); 12] = [
    ("ev_id", pg_sys::INT8OID),
    ("ev_time", pg_sys::TIMESTAMPTZOID),
    ("ev_txid", pg_sys::XID8OID),
    ("ev_owner", pg_sys::INT4OID),
    ("ev_retry", pg_sys::INT4OID),
    ("ev_type", pg_sys::TEXTOID),
    ("ev_data", pg_sys::TEXTOID),
    ("ev_extra1", pg_sys::TEXTOID),
    ("ev_extra2", pg_sys::TEXTOID),
    ("ev_extra3", pg_sys::TEXTOID),
    ("ev_extra4", pg_sys::TEXTOID),
    ("ev_headers", pg_sys::JSONBOID),
];
/// Columns of an event table made before ev_headers.
const LAYOUT_WITHOUT_HEADERS: usize = 11;
const EV_ID: usize = 0;
const EV_TIME: usize = 1;
const EV_TXID: usize = 2;
const EV_TYPE: usize = 5;
const EV_DATA: usize = 6;
const EV_EXTRA1: usize = 7;
const EV_HEADERS: usize = 11;

/// Rows per heap_multi_insert call: enough to fill several pages per WAL
/// record, few enough that a chunk's values stay in a small, reused memory
/// context (a call of 1,000 rows kept whole cost more per row than 100).
const CHUNK: usize = 128;

/// A text value for one column: NULL, a Rust string (copied into a text
/// datum), or a datum that already is text.
#[derive(Clone, Copy)]
pub enum Val<'a> {
    Null,
    Str(&'a str),
    Datum(pg_sys::Datum),
}

/// The queue's current event table opened for appending, with its indexes.
pub struct Target {
    rel: pg_sys::Relation,
    estate: *mut pg_sys::EState,
    rri: *mut pg_sys::ResultRelInfo,
    slots: Vec<*mut pg_sys::TupleTableSlot>,
    desc: pg_sys::TupleDesc,
    used: usize,
    /// Where a chunk's values are built (reset after each chunk) and the
    /// context to return to.
    rows_cxt: pg_sys::MemoryContext,
    outer_cxt: pg_sys::MemoryContext,
    cid: pg_sys::CommandId,
    time: pg_sys::Datum,
    txid: pg_sys::Datum,
    /// The table's column count (with or without ev_headers).
    natts: usize,
}

impl Target {
    /// Opens `q`'s current table (RowExclusiveLock, as an INSERT takes) for
    /// up to `n` rows; None when the SQL INSERT must be used instead (the
    /// module comment lists when). Until [`Target::finish`], the current
    /// memory context is the target's chunk context, reset after each
    /// chunk: values that must outlive a chunk are made before `open`.
    /// `headers`: rows will carry headers (None when the table has no
    /// ev_headers column: the SQL INSERT then says so).
    pub fn open(q: &Queue, n: usize, headers: bool) -> Option<Target> {
        unsafe {
            if pg_sys::XactReadOnly {
                return None; // the SQL INSERT raises the read-only error
            }
            let schema = c"pgque";
            let name = CString::new(format!("event_{}_{}", q.id, q.cur_table)).unwrap();
            let rv = pg_sys::makeRangeVar(schema.as_ptr() as *mut _, name.as_ptr() as *mut _, -1);
            let lock = pg_sys::RowExclusiveLock as pg_sys::LOCKMODE;
            let rel = pg_sys::table_openrv(rv, lock);
            let natts = (*(*rel).rd_att).natts as usize;
            if !plain_event_table(rel) || (headers && natts <= EV_HEADERS) {
                pg_sys::table_close(rel, lock);
                return None;
            }
            let estate = pg_sys::CreateExecutorState();
            let rri = pg_sys::palloc0(std::mem::size_of::<pg_sys::ResultRelInfo>())
                as *mut pg_sys::ResultRelInfo;
            pg_sys::InitResultRelInfo(rri, rel, 1, std::ptr::null_mut(), 0);
            pg_sys::ExecOpenIndices(rri, false);
            let mut t = Target {
                rel,
                estate,
                rri,
                slots: Vec::new(),
                desc: std::ptr::null_mut(),
                used: 0,
                rows_cxt: std::ptr::null_mut(),
                outer_cxt: std::ptr::null_mut(),
                cid: 0,
                time: pg_sys::Datum::from(0),
                txid: pg_sys::Datum::from(0),
                natts,
            };
            for i in 0..(*rri).ri_NumIndices as usize {
                let idx = *(*rri).ri_IndexRelationDescs.add(i);
                if !(*(*idx).rd_index).indimmediate {
                    t.close();
                    return None;
                }
            }
            // The columns' defaults, as the SQL INSERT evaluates them:
            // now() and pg_current_xact_id() (the top transaction's id).
            t.time = pg_sys::Datum::from(pg_sys::GetCurrentTransactionStartTimestamp());
            t.txid = pg_sys::Datum::from(pg_sys::GetTopFullTransactionId().value);
            t.cid = pg_sys::GetCurrentCommandId(true);
            // The slots share a copy of the descriptor that is not
            // reference-counted: on the relation's own, each slot pinned it
            // in the resource owner and unpinned it when dropped (2% of a
            // 100-row call's CPU).
            let k = n.clamp(1, CHUNK);
            t.desc = pg_sys::CreateTupleDescCopy((*rel).rd_att);
            let ops = pg_sys::table_slot_callbacks(rel);
            t.slots = (0..k)
                .map(|_| pg_sys::MakeSingleTupleTableSlot(t.desc, ops))
                .collect();
            t.rows_cxt = pg_sys::AllocSetContextCreateInternal(
                pg_sys::CurrentMemoryContext,
                c"pgque send rows".as_ptr(),
                pg_sys::ALLOCSET_DEFAULT_MINSIZE as usize,
                pg_sys::ALLOCSET_DEFAULT_INITSIZE as usize,
                pg_sys::ALLOCSET_DEFAULT_MAXSIZE as usize,
            );
            t.outer_cxt = pg_sys::MemoryContextSwitchTo(t.rows_cxt);
            Some(t)
        }
    }

    /// Adds one event (id, type, payload, ev_extra1..4, headers: a jsonb
    /// datum, only on a target opened for headers); rows are written CHUNK
    /// at a time and by [`Target::finish`]. Values made in the chunk
    /// context must be made after the previous push returned.
    pub fn push(
        &mut self,
        id: i64,
        ev_type: Val,
        data: Val,
        extra: [Val; 4],
        headers: Option<pg_sys::Datum>,
    ) {
        unsafe {
            let slot = self.slots[self.used];
            pg_sys::ExecClearTuple(slot);
            let values = std::slice::from_raw_parts_mut((*slot).tts_values, self.natts);
            let nulls = std::slice::from_raw_parts_mut((*slot).tts_isnull, self.natts);
            nulls.fill(true);
            if let Some(h) = headers {
                values[EV_HEADERS] = h;
                nulls[EV_HEADERS] = false;
            }
            values[EV_ID] = pg_sys::Datum::from(id);
            values[EV_TIME] = self.time;
            values[EV_TXID] = self.txid;
            nulls[EV_ID] = false;
            nulls[EV_TIME] = false;
            nulls[EV_TXID] = false;
            let cols = [ev_type, data, extra[0], extra[1], extra[2], extra[3]];
            for (i, v) in cols.into_iter().enumerate() {
                let c = [
                    EV_TYPE,
                    EV_DATA,
                    EV_EXTRA1,
                    EV_EXTRA1 + 1,
                    EV_EXTRA1 + 2,
                    EV_EXTRA1 + 3,
                ][i];
                match v {
                    Val::Null => {}
                    Val::Str(s) => {
                        values[c] = text_datum(s);
                        nulls[c] = false;
                    }
                    Val::Datum(d) => {
                        values[c] = d;
                        nulls[c] = false;
                    }
                }
            }
            pg_sys::ExecStoreVirtualTuple(slot);
        }
        self.used += 1;
        // A full chunk is written now, not when the next row comes: that
        // row's values are made (in the chunk context) before push is called.
        if self.used == self.slots.len() {
            self.flush();
        }
    }

    /// Writes the buffered rows and their index entries.
    fn flush(&mut self) {
        if self.used == 0 {
            return;
        }
        unsafe {
            pg_sys::heap_multi_insert(
                self.rel,
                self.slots.as_mut_ptr(),
                self.used as i32,
                self.cid,
                0,
                std::ptr::null_mut(),
            );
            for &slot in &self.slots[..self.used] {
                insert_index_tuples(self.rri, slot, self.estate);
                pg_sys::ExecClearTuple(slot);
            }
            pg_sys::MemoryContextReset(self.rows_cxt);
        }
        self.used = 0;
    }

    /// Writes what is left, makes the rows visible to the transaction's
    /// next statements (as SPI's INSERT would) and closes the table.
    pub fn finish(mut self) {
        self.flush();
        unsafe { pg_sys::CommandCounterIncrement() };
        self.close();
    }

    fn close(&mut self) {
        unsafe {
            if !self.rows_cxt.is_null() {
                pg_sys::MemoryContextSwitchTo(self.outer_cxt);
                pg_sys::MemoryContextDelete(self.rows_cxt);
                self.rows_cxt = std::ptr::null_mut();
            }
            for &slot in &self.slots {
                pg_sys::ExecDropSingleTupleTableSlot(slot);
            }
            self.slots.clear();
            if !self.desc.is_null() {
                pg_sys::FreeTupleDesc(self.desc);
                self.desc = std::ptr::null_mut();
            }
            pg_sys::ExecCloseIndices(self.rri);
            pg_sys::FreeExecutorState(self.estate);
            pg_sys::table_close(self.rel, pg_sys::NoLock as pg_sys::LOCKMODE);
        }
    }
}

/// The index entries of one inserted row (no arbiter, no deferred checks:
/// [`Target::open`] refused tables with deferred unique indexes).
unsafe fn insert_index_tuples(
    rri: *mut pg_sys::ResultRelInfo,
    slot: *mut pg_sys::TupleTableSlot,
    estate: *mut pg_sys::EState,
) {
    unsafe {
        #[cfg(any(feature = "pg14", feature = "pg15"))]
        let l = pg_sys::ExecInsertIndexTuples(
            rri,
            slot,
            estate,
            false,
            false,
            std::ptr::null_mut(),
            std::ptr::null_mut(),
        );
        #[cfg(not(any(feature = "pg14", feature = "pg15")))]
        let l = pg_sys::ExecInsertIndexTuples(
            rri,
            slot,
            estate,
            false,
            false,
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            false,
        );
        pg_sys::list_free(l);
    }
}

/// True when `rel` is a plain table with the event layout and nothing an
/// INSERT statement would run or check beyond NOT NULL and its indexes.
unsafe fn plain_event_table(rel: pg_sys::Relation) -> bool {
    unsafe {
        let form = &*(*rel).rd_rel;
        if form.relkind != pg_sys::RELKIND_RELATION as core::ffi::c_char
            || form.relhasrules
            || form.relrowsecurity
            || !(*rel).trigdesc.is_null()
        {
            return false;
        }
        let desc = (*rel).rd_att;
        let natts = (*desc).natts as usize;
        if natts != LAYOUT.len() && natts != LAYOUT_WITHOUT_HEADERS {
            return false;
        }
        let constr = (*desc).constr;
        if !constr.is_null() && ((*constr).num_check > 0 || (*constr).has_generated_stored) {
            return false;
        }
        let attrs = attributes(desc);
        attrs.iter().zip(LAYOUT).all(|(a, (name, typ))| {
            !a.attisdropped
                && a.atttypid == typ
                && std::ffi::CStr::from_ptr(a.attname.data.as_ptr()).to_bytes() == name.as_bytes()
        })
    }
}

/// The attribute rows of a tuple descriptor. PostgreSQL 18 stores them
/// after the compact attributes (its TupleDescAttr does the same sum).
unsafe fn attributes<'a>(desc: pg_sys::TupleDesc) -> &'a [pg_sys::FormData_pg_attribute] {
    unsafe {
        let n = (*desc).natts as usize;
        #[cfg(not(feature = "pg18"))]
        let first = (*desc).attrs.as_ptr();
        #[cfg(feature = "pg18")]
        let first = (*desc)
            .compact_attrs
            .as_ptr()
            .add(n)
            .cast::<pg_sys::FormData_pg_attribute>();
        std::slice::from_raw_parts(first, n)
    }
}

/// A Rust string as a text datum (palloc'd in the current context).
pub fn text_datum(s: &str) -> pg_sys::Datum {
    unsafe {
        pg_sys::Datum::from(pg_sys::cstring_to_text_with_len(
            s.as_ptr() as *const _,
            s.len() as i32,
        ))
    }
}

/// A jsonb datum's text (what `jsonb::text` gives, [`crate::jsontext`]) as
/// a text datum; `scratch` is a buffer reused between calls.
pub fn jsonb_text(jsonb: pg_sys::Datum, scratch: &mut Vec<u8>) -> pg_sys::Datum {
    unsafe {
        let jb = pg_sys::pg_detoast_datum(jsonb.cast_mut_ptr()) as *const u8;
        scratch.clear();
        scratch.extend_from_slice(&[0u8; 4]);
        crate::jsontext::append_jsonb_text(scratch, jb);
        let data = pg_sys::palloc(scratch.len()) as *mut u8;
        std::ptr::copy_nonoverlapping(scratch.as_ptr(), data, scratch.len());
        set_varsize(data, scratch.len());
        pg_sys::Datum::from(data)
    }
}

unsafe fn set_varsize(p: *mut u8, len: usize) {
    unsafe { pgrx::varlena::set_varsize_4b(p as *mut pg_sys::varlena, len as i32) }
}
