//! The event-log engine: queues with rotating append-only event tables,
//! ticks, batches, consumer positions, retries, rotation.
//!
//! The modules stand on each other in one direction (scripts/layers.py
//! checks it): `spi` (how SQL runs), `schema` (which tables this database
//! has), `queue` (queues and consumers by name), `slot` (a key's slot) and
//! `events` (reading event rows) at the bottom; ticks, batches and their
//! cuts, slots and their leases, pause, resize, retry and maintenance above
//! them. This file only declares them and names what the SQL API above uses
//! most (`crate::log::Queue`, `crate::log::exec`, ...); nothing in `log/`
//! imports through it.
use pgrx::prelude::*;

pub mod batch;
pub mod cuts;
pub mod direct;
pub mod events;
pub mod insert;
pub mod lifecycle;
pub mod look;
pub mod maint;
pub mod pause;
pub mod qlookup;
pub mod queue;
pub mod resize;
pub mod retry;
pub mod schema;
pub mod slot;
pub mod slots;
pub mod spi;
pub mod tick;

pub use insert::{insert_event, insert_events, send_event, send_events, NewEvent};
pub use lifecycle::{create_queue, drop_queue, register, unregister};
pub use queue::{
    check_consumer_room, event_parent, event_seq, event_table, find_queue, find_sub, queue_by_name,
    sub_by_name, valid_consumer, Queue, Sub,
};
pub use schema::{dead_letter_store_installed, dead_letter_table, headers_col};
pub use spi::{col, exec, exec_read, first_row, reads_only, run_once, try_lock_exclusive};

extension_sql_file!(
    "../../sql/10_event_log.sql",
    name = "event_log",
    requires = ["bootstrap"]
);
