//! Shared state of the background workers (filled in by the worker commit).
pub fn init() {}
pub fn available() -> bool {
    false
}
