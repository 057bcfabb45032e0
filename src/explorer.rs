//! The job explorer behind pgque-web's jobs, job, flow and schedules pages:
//! SQL functions (sql/34_explorer.sql) that read one page of jobs by keyset,
//! one job with its history and relatives, a flow's graph, and run a
//! schedule now. All SECURITY DEFINER, granted to pgque_reader (reads) or
//! pgque_admin (changes), so the dashboard never reads pgque's tables.
use pgrx::prelude::*;

extension_sql_file!(
    "../sql/34_explorer.sql",
    name = "explorer",
    requires = ["job_log", "flows", "schedules"]
);

// The event browser behind pgque-web's page of one event queue: its
// waiting events and its dead letters, a page at a time.
extension_sql_file!(
    "../sql/35_event_browser.sql",
    name = "event_browser",
    requires = ["event_log", "explorer"]
);

// The minute-by-minute history of each queue that pgque-web's charts read,
// written and rotated (three pieces, TRUNCATE) by the worker's `history` duty.
extension_sql_file!(
    "../sql/36_history.sql",
    name = "history",
    requires = ["event_browser"]
);
