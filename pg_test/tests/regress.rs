//! SQL regression files: each `pg_test/sql/NAME.sql` runs through psql in a
//! fresh database with pgque; its output must equal `pg_test/expected/NAME.out`.
//! `PGQUE_REGRESS_ACCEPT=1` writes the expected files from the results instead
//! (review the diff before committing them). Results land in `pg_test/results/`.
use pgque_pg_test::*;
use std::path::{Path, PathBuf};
use std::process::Command;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// psql's echo of the input (-a) with errors merged in order, and the two
/// things that vary between runs masked: the server version in messages and
/// psql's own line prefix for stdin.
fn run_file(db: &TestDb, path: &Path) -> String {
    let out = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "'{}/psql' -X -a -q -v VERBOSITY=default -h '{}' -p {} -U postgres -d '{}' -f - < '{}' 2>&1",
            bindir(),
            host(),
            port(),
            db.name,
            path.display()
        ))
        .env("PGAPPNAME", "pgque_regress")
        .env("PGTZ", "UTC")
        .env("PGDATESTYLE", "ISO, YMD")
        .output()
        .expect("run psql");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn sql_regression_files() {
    let sql_dir = root().join("sql");
    let exp_dir = root().join("expected");
    let res_dir = root().join("results");
    std::fs::create_dir_all(&res_dir).unwrap();
    let mut files: Vec<PathBuf> = std::fs::read_dir(&sql_dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "sql"))
        .collect();
    files.sort();
    assert!(
        !files.is_empty(),
        "no regression files in {}",
        sql_dir.display()
    );
    let accept = std::env::var("PGQUE_REGRESS_ACCEPT").is_ok_and(|v| v == "1");
    let mut failed = Vec::new();
    for f in &files {
        let stem = f.file_stem().unwrap().to_string_lossy().into_owned();
        let db = TestDb::new(&format!("regress_{stem}"));
        let got = run_file(&db, f);
        std::fs::write(res_dir.join(format!("{stem}.out")), &got).unwrap();
        let exp_path = exp_dir.join(format!("{stem}.out"));
        if accept {
            std::fs::write(&exp_path, &got).unwrap();
            println!("accepted {stem}");
            continue;
        }
        let expected = std::fs::read_to_string(&exp_path).unwrap_or_default();
        if expected != got {
            let diff = Command::new("diff")
                .args(["-u"])
                .arg(&exp_path)
                .arg(res_dir.join(format!("{stem}.out")))
                .output()
                .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
                .unwrap_or_default();
            println!("--- regression {stem} differs:\n{diff}");
            failed.push(stem);
        } else {
            println!("ok regression {stem}");
        }
    }
    assert!(
        failed.is_empty(),
        "regression files differ: {failed:?} (see diffs above)"
    );
}
