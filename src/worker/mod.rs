//! The background workers (filled in by the worker commit).
pub mod wake;
pub fn init() {}
