//! CREATE EXTENSION pgque in many databases at the same moment, on a cluster
//! where pgque's roles do not exist yet and again where they do, while other
//! sessions grant pgque's roles to application roles: every install must
//! succeed (no deadlock on the cluster-wide roles, no duplicate-role error),
//! and the roles must come out as one install makes them. On a private
//! cluster: the first round needs a cluster that never had pgque.
use pgque_pg_test::postgres::Client;
use pgque_pg_test::*;
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

const DBS: usize = 6;

fn install_all_at_once(cl: &Cluster, round: usize) {
    let barrier = Arc::new(Barrier::new(DBS + 1));
    let mut installs = vec![];
    for i in 0..DBS {
        let mut c = cl.connect(&format!("inst_{i}"));
        let b = barrier.clone();
        installs.push(std::thread::spawn(move || {
            b.wait();
            c.batch_execute("CREATE EXTENSION pgque")
                .map_err(|e| format!("inst_{i}: {e:?}"))
        }));
    }
    // An application role getting pgque's roles while the installs run, in
    // the other order than pgque grants them to pgque_admin (GRANT locks the
    // roles it names).
    let mut granters = vec![];
    for (g, order) in [["pgque_writer", "pgque_reader"]].into_iter().enumerate() {
        let mut c = cl.connect("postgres");
        c.batch_execute(&format!(
            "DO $$ BEGIN CREATE ROLE inst_app{g}; EXCEPTION WHEN duplicate_object THEN NULL; END $$"
        ))
        .unwrap();
        let b = barrier.clone();
        granters.push(std::thread::spawn(move || {
            b.wait();
            let until = Instant::now() + Duration::from_millis(1500);
            let mut deadlocks = 0;
            while Instant::now() < until {
                // Before the first install commits the roles do not exist
                // (42704): that is the application's problem, not pgque's.
                let r = c.batch_execute(&format!(
                    "GRANT {}, {} TO inst_app{g}; REVOKE {}, {} FROM inst_app{g}",
                    order[0], order[1], order[0], order[1]
                ));
                if let Err(e) = r {
                    if sqlstate::<()>(Err(e)) == "40P01" {
                        deadlocks += 1;
                    }
                }
            }
            deadlocks
        }));
    }
    let failed: Vec<String> = installs
        .into_iter()
        .filter_map(|t| t.join().unwrap().err())
        .collect();
    let deadlocks: i32 = granters.into_iter().map(|t| t.join().unwrap()).sum();
    assert!(
        failed.is_empty(),
        "round {round}: {} of {DBS} concurrent installs failed: {failed:#?}",
        failed.len()
    );
    assert_eq!(
        deadlocks, 0,
        "round {round}: the installs deadlocked the application's grants {deadlocks} times"
    );
}

fn memberships(c: &mut Client) -> Vec<(String, String)> {
    c.query(
        "SELECT g.rolname::text, m.rolname::text FROM pg_auth_members am \
           JOIN pg_roles g ON g.oid = am.roleid JOIN pg_roles m ON m.oid = am.member \
          WHERE m.rolname LIKE 'pgque%' ORDER BY 1, 2",
        &[],
    )
    .unwrap()
    .iter()
    .map(|r| (r.get(0), r.get(1)))
    .collect()
}

#[test]
fn concurrent_installs_all_succeed() {
    let cl = Cluster::start_new("installs", "");
    let mut admin = cl.connect("postgres");
    for i in 0..DBS {
        admin
            .batch_execute(&format!("CREATE DATABASE inst_{i}"))
            .unwrap();
    }
    let roles: i64 = admin
        .query_one(
            "SELECT count(*) FROM pg_roles WHERE rolname LIKE 'pgque%'",
            &[],
        )
        .unwrap()
        .get(0);
    assert_eq!(roles, 0, "a fresh cluster has no pgque roles");

    install_all_at_once(&cl, 1);
    let want = vec![
        ("pgque_reader".to_string(), "pgque_admin".to_string()),
        ("pgque_writer".to_string(), "pgque_admin".to_string()),
    ];
    assert_eq!(memberships(&mut admin), want);

    // The roles exist now: reinstall everywhere at once.
    for i in 0..DBS {
        cl.connect(&format!("inst_{i}"))
            .batch_execute("DROP EXTENSION pgque CASCADE")
            .unwrap();
    }
    install_all_at_once(&cl, 2);
    assert_eq!(memberships(&mut admin), want);
    for i in 0..DBS {
        let n: i64 = cl
            .connect(&format!("inst_{i}"))
            .query_one(
                "SELECT count(*) FROM pg_extension WHERE extname = 'pgque'",
                &[],
            )
            .unwrap()
            .get(0);
        assert_eq!(n, 1, "inst_{i}");
    }
}
