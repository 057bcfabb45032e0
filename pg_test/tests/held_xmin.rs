//! Held xmin, short version of `make soak` (tests/soak.rs): steady
//! produce/consume on an event queue and on a job queue, 5 s clean, 20 s with
//! a REPEATABLE READ snapshot held open, 10 s after it ends, on a private
//! cluster whose autovacuum looks every second and whose metadata pieces
//! rotate every 4 s. Event tables and the job log stay at zero dead tuples
//! (the job load is ordinary jobs, which the job log stores append-only),
//! metadata dead tuples stay bounded, throughput holds, and the job store is
//! back to its clean level once the snapshot is gone.
mod soak_util;
use pgque_pg_test::*;
use soak_util::*;

#[test]
fn held_snapshot_does_not_bloat_or_stall_queues() {
    let cl = Cluster::start_new(
        "held_xmin",
        "autovacuum_naptime = 1\npgque.metadata_rotation_period = 4000",
    );
    let rates = Rates {
        events: 500,
        jobs: 200,
    };
    let phases = run(&cl, "hx", rates, 5, 20, 10);
    eprintln!("{}", report(&phases));
    check(&phases);
}
