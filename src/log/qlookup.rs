//! The send path's queue lookup below SQL: one probe of `pgque.queue`'s
//! unique index on queue_name (systable_beginscan), with no SPI connection,
//! plan, executor or result set.
//!
//! A send is one lookup and one row; as an SPI statement the lookup was
//! about a tenth of a single send's backend CPU (executor start and end, an
//! index scan node, the result's copy, pg_stat_statements' hooks), more than
//! the row's heap and index insert (benches/results/cpu.md).
//!
//! It reads the row with the snapshot the SPI statement would have used
//! (pgrx's rule, `Spi::is_xact_still_immutable`): the calling statement's
//! while the transaction has no xid, else a fresh one after a command
//! counter increment, as SPI takes for a statement of a transaction that
//! wrote (so a queue created earlier in the same transaction is found).
//! Columns are found by name, since an upgraded database may have them at
//! other positions than a fresh install. The caller already runs as the
//! schema's owner (crate::api::owner), who may read the table.
use super::queue::Queue;
use pgrx::pg_sys;

/// The queue named `name` as [`super::queue::find_queue`] reads it; `Some(None)`
/// when there is no such queue, `None` when this lookup cannot be made
/// here (no active snapshot, the table or its index not as expected) and
/// the caller must use the SQL lookup.
pub fn find(name: &str) -> Option<Option<Queue>> {
    unsafe {
        let fresh = pg_sys::GetCurrentTransactionIdIfAny() != pg_sys::InvalidTransactionId;
        if !fresh && !pg_sys::ActiveSnapshotSet() {
            return None;
        }
        let ns = pg_sys::get_namespace_oid(c"pgque".as_ptr(), true);
        if ns == pg_sys::InvalidOid {
            return None;
        }
        let relid = pg_sys::get_relname_relid(c"queue".as_ptr(), ns);
        if relid == pg_sys::InvalidOid {
            return None;
        }
        let cols = [
            c"queue_name",
            c"queue_id",
            c"queue_cur_table",
            c"queue_ntables",
            c"queue_max_retries",
            c"queue_event_seq",
        ]
        .map(|c| pg_sys::get_attnum(relid, c.as_ptr()));
        if cols.contains(&(pg_sys::InvalidAttrNumber as i16)) {
            return None;
        }
        let lock = pg_sys::AccessShareLock as pg_sys::LOCKMODE;
        let rel = pg_sys::table_open(relid, lock);
        let Some((index, collation)) = name_index(rel, cols[0]) else {
            pg_sys::table_close(rel, lock);
            return None;
        };
        if fresh {
            pg_sys::CommandCounterIncrement();
            pg_sys::PushActiveSnapshot(pg_sys::GetTransactionSnapshot());
            pg_sys::UpdateActiveSnapshotCommandId();
        }
        let key_text =
            pg_sys::cstring_to_text_with_len(name.as_ptr() as *const _, name.len() as i32);
        let mut key: pg_sys::ScanKeyData = std::mem::zeroed();
        // systable_beginscan takes the heap's attribute number and maps it
        // to the index column. The key carries the index's collation: the
        // btree is sorted by it, and its descent compares the key with that
        // collation (ScanKeyInit's C collation finds a name only where the
        // two orders happen to agree).
        pg_sys::ScanKeyEntryInitialize(
            &mut key,
            0,
            cols[0],
            pg_sys::BTEqualStrategyNumber as u16,
            pg_sys::InvalidOid,
            collation,
            pg_sys::Oid::from(pg_sys::F_TEXTEQ),
            pg_sys::Datum::from(key_text),
        );
        let scan =
            pg_sys::systable_beginscan(rel, index, true, pg_sys::GetActiveSnapshot(), 1, &mut key);
        let tup = pg_sys::systable_getnext(scan);
        let found = if tup.is_null() {
            None
        } else {
            let desc = (*rel).rd_att;
            let n = (*desc).natts as usize;
            let mut values = vec![pg_sys::Datum::from(0); n];
            let mut nulls = vec![true; n];
            pg_sys::heap_deform_tuple(tup, desc, values.as_mut_ptr(), nulls.as_mut_ptr());
            let get = |i: usize| {
                let a = cols[i] as usize - 1;
                (!nulls[a]).then_some(values[a])
            };
            let int = |i: usize| get(i).map(|d| d.value() as i32);
            match (int(1), int(2), int(3), int(4), get(5)) {
                (Some(id), Some(cur_table), Some(ntables), Some(max_retries), Some(seq)) => {
                    Some(Queue {
                        id,
                        name: name.to_string(),
                        cur_table,
                        ntables,
                        max_retries,
                        seq: pg_sys::Oid::from(seq.value() as u32),
                    })
                }
                _ => pgrx::error!("pgque: queue {name:?} has a NULL column"),
            }
        };
        pg_sys::systable_endscan(scan);
        if fresh {
            pg_sys::PopActiveSnapshot();
        }
        pg_sys::table_close(rel, pg_sys::NoLock as pg_sys::LOCKMODE);
        Some(found)
    }
}

/// The valid unique index of `rel` on the single column `attnum`, with the
/// collation of that index column.
unsafe fn name_index(rel: pg_sys::Relation, attnum: i16) -> Option<(pg_sys::Oid, pg_sys::Oid)> {
    unsafe {
        let list = pg_sys::RelationGetIndexList(rel);
        let cells: &[pg_sys::ListCell] = if list.is_null() {
            &[]
        } else {
            std::slice::from_raw_parts((*list).elements, (*list).length as usize)
        };
        let mut found = None;
        for cell in cells {
            let oid = cell.oid_value;
            let tup = pg_sys::SearchSysCache1(
                pg_sys::SysCacheIdentifier::INDEXRELID as _,
                pg_sys::Datum::from(oid),
            );
            if tup.is_null() {
                continue;
            }
            let ix = &*pg_sys::heap_tuple_get_struct::<pg_sys::FormData_pg_index>(tup);
            let ok = ix.indisunique
                && ix.indisvalid
                && ix.indnkeyatts == 1
                && ix.indnatts == 1
                && ix.indkey.values.as_slice(1)[0] == attnum;
            pg_sys::ReleaseSysCache(tup);
            if ok {
                found = Some(oid);
                break;
            }
        }
        pg_sys::list_free(list);
        let oid = found?;
        // the index relation is in the relcache once the scan opens it; its
        // rd_indcollation is what the btree sorts by
        let irel = pg_sys::index_open(oid, pg_sys::AccessShareLock as pg_sys::LOCKMODE);
        let collation = *(*irel).rd_indcollation;
        pg_sys::index_close(irel, pg_sys::NoLock as pg_sys::LOCKMODE);
        Some((oid, collation))
    }
}
