//! The background workers.
//!
//! - `launcher`: one static worker per server. At start, and every
//!   `pgque.launcher_rescan_interval`, it looks for connectable databases
//!   whose worker is missing; a database without the extension sees that
//!   worker look and leave at once. It starts workers within the pool's
//!   bound (`crate::pool`): any number of databases share pgque.max_workers
//!   processes, a database holding one only while it has work.
//! - `dbworker`: one per database with the extension and work to do. It
//!   runs the duties of `duties` (each a SQL function) on their cadences in
//!   short transactions.
//! - `hooks`: DROP / RENAME DATABASE (and CREATE DATABASE ... TEMPLATE) stop
//!   the database's worker first, since they need it gone.
//! - `spawn`: starting a database worker (a dynamic background worker).
//!
//! What the API below needs of the workers lives below it: `crate::wake`
//! (a committing producer wakes its database's worker; a committing start()
//! launches it) and `crate::pool` (the rules of the demand table in shared
//! memory).
//!
//! CREATE EXTENSION calls pgque.start(), which asks the launcher for a
//! worker when its transaction commits (wake::spawn_at_commit), so a new
//! database with pgque gets its worker at once, not a rescan later.
pub mod dbworker;
pub mod due;
pub mod duties;
pub mod hooks;
pub mod launcher;
pub mod spawn;

/// Registers the launcher and the utility hook; called from `_PG_init` while
/// shared_preload_libraries is being processed.
pub fn init() {
    launcher::register();
    hooks::install();
}
