//! `make soak`: the held-xmin soak (about 8 minutes with the defaults).
//! Steady produce/consume on an event queue and on a job queue for a clean
//! phase, then with a REPEATABLE READ session holding its snapshot open, then
//! a recovery phase after it ends; throughput, call latency and dead tuples
//! per pgque table at the end of each phase, written as markdown to
//! $SOAK_REPORT (benches/results/soak-pg<N>.md from `make soak`).
//!
//! Env (seconds / per second): SOAK_CLEAN_S=60 SOAK_HOLD_S=300
//! SOAK_RECOVERY_S=120 SOAK_EVENT_RATE=1000 SOAK_JOB_RATE=300.
//! Ignored by plain `cargo test`; `make soak` runs it with --ignored.
mod soak_util;
use pgque_pg_test::*;
use soak_util::*;

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .map(|v| {
            v.parse()
                .unwrap_or_else(|_| panic!("{name} must be a number"))
        })
        .unwrap_or(default)
}

#[test]
#[ignore = "long: run by `make soak`"]
fn soak_held_xmin() {
    let (clean, hold, rec) = (
        env_u64("SOAK_CLEAN_S", 60),
        env_u64("SOAK_HOLD_S", 300),
        env_u64("SOAK_RECOVERY_S", 120),
    );
    let rates = Rates {
        events: env_u64("SOAK_EVENT_RATE", 1000),
        jobs: env_u64("SOAK_JOB_RATE", 300),
    };
    // Default autovacuum settings (naptime 1 min): what a production server has.
    let cl = Cluster::start_new("soak", "");
    let phases = run(&cl, "soak", rates, clean, hold, rec);
    let mut out = format!(
        "Offered load: {} events/s (send_batch, 10 transactions/s), {} jobs/s \
         (enqueue_ready_rows, 10 transactions/s); one event consumer (receive 1000 + ack), \
         two job workers (dispatch 50 + complete_many). Phases: clean {clean} s, \
         REPEATABLE READ snapshot held {hold} s, recovery {rec} s. PostgreSQL {}, \
         private cluster (fsync off), default autovacuum (naptime 1 min), \
         queue rotation_period 20 s, other pgque settings default.\n\n",
        rates.events,
        rates.jobs,
        major()
    );
    out.push_str(&report(&phases));
    let fams = ["event", "meta", "job"];
    out.push_str("\nTotals per family (dead / live):\n\n| family |");
    for p in &phases {
        out.push_str(&format!(" {} |", p.name));
    }
    out.push_str("\n|---|---:|---:|---:|\n");
    for f in fams {
        out.push_str(&format!("| {f} |"));
        for p in &phases {
            out.push_str(&format!(" {} / {} |", dead_of(p, f), live_of(p, f)));
        }
        out.push('\n');
    }
    println!("{out}");
    if let Ok(path) = std::env::var("SOAK_REPORT") {
        std::fs::write(&path, &out).unwrap_or_else(|e| panic!("write {path}: {e}"));
        println!("report written to {path}");
    }
    check(&phases);
}
