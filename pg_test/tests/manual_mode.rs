//! Without shared_preload_libraries: no worker, status() says manual mode,
//! and the extension still installs and answers. Starts a second, throwaway
//! server of the same version without the preload.
use pgque_pg_test::postgres::{Client, NoTls};
use pgque_pg_test::*;
use std::process::Command;

fn as_postgres(cmd: &str, args: &[&str]) -> std::process::Output {
    let root = Command::new("id")
        .arg("-u")
        .output()
        .map(|o| o.stdout == b"0\n")
        .unwrap_or(false);
    let mut c = if root {
        let mut c = Command::new("runuser");
        c.args(["-u", "postgres", "--", cmd]);
        c
    } else {
        Command::new(cmd)
    };
    c.args(args).output().expect("run as postgres")
}

#[test]
fn without_preload_status_says_manual_mode() {
    let dir = format!("/tmp/pgque_manual_{}", major());
    let port = (port() + 100).to_string();
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let _ = Command::new("chown").args(["postgres", &dir]).status();
    let bin = bindir();
    let mut args: Vec<String> = ["-D", &dir, "-A", "trust", "-U", "postgres", "--no-sync"]
        .map(String::from)
        .to_vec();
    args.extend(initdb_locale());
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = as_postgres(&format!("{bin}/initdb"), &args);
    assert!(
        out.status.success(),
        "initdb: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let opts = format!("-p {port} -c listen_addresses='' -c unix_socket_directories={dir}");
    let out = as_postgres(
        &format!("{bin}/pg_ctl"),
        &[
            "-D",
            &dir,
            "-o",
            &opts,
            "-l",
            &format!("{dir}/log"),
            "-w",
            "start",
        ],
    );
    assert!(
        out.status.success(),
        "pg_ctl start: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let result = std::panic::catch_unwind(|| {
        let mut c = Client::connect(
            &format!("host={dir} port={port} user=postgres dbname=postgres"),
            NoTls,
        )
        .unwrap();
        c.batch_execute("CREATE EXTENSION pgque").unwrap();
        let rows = c
            .query(
                "SELECT component, status, detail FROM pgque.status() ORDER BY 1",
                &[],
            )
            .unwrap();
        let got: Vec<(String, String)> = rows.iter().map(|r| (r.get(0), r.get(1))).collect();
        assert_eq!(
            got,
            vec![
                ("mode".into(), "manual".into()),
                ("worker".into(), "absent".into())
            ]
        );
        let detail: String = rows[0].get(2);
        assert!(
            detail.contains("pgque.ticker()") && detail.contains("pgque.maint()"),
            "{detail}"
        );
        // start() cannot start a worker here and says so.
        let started: bool = c.query_one("SELECT pgque.start()", &[]).unwrap().get(0);
        assert!(!started);
        let n: i64 = c
            .query_one(
                "SELECT count(*) FROM pg_stat_activity WHERE backend_type LIKE 'pgque%'",
                &[],
            )
            .unwrap()
            .get(0);
        assert_eq!(n, 0);
    });
    let _ = as_postgres(
        &format!("{bin}/pg_ctl"),
        &["-D", &dir, "-m", "immediate", "stop"],
    );
    let _ = std::fs::remove_dir_all(&dir);
    if let Err(e) = result {
        std::panic::resume_unwind(e);
    }
}
