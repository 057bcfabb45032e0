//! Waking this database's worker when a transaction that produced work commits.

/// Asks that this database's pgque worker be woken when the current
/// transaction commits (not before: it must see the committed rows). Cheap to
/// call many times per transaction; a no-op without shared_preload_libraries.
pub fn at_commit() {}
