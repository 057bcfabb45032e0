//! Helpers for the server-level tests: a real PostgreSQL started by
//! `pg_test/run.sh` with `shared_preload_libraries = 'pgque'`, reached through
//! the PGQUE_TEST_* environment variables it sets.
//!
//! Each test makes its own database (`TestDb::new`), so tests run in parallel
//! without seeing each other's queues, and each database gets its own pgque
//! background worker, as in production.
use postgres::{Client, NoTls};
use std::process::Command;
use std::time::{Duration, Instant};

pub use postgres;

fn env(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| {
        panic!("{name} is not set: run these tests through `make pgtest` (pg_test/run.sh)")
    })
}

/// Socket directory of the test server.
pub fn host() -> String {
    env("PGQUE_TEST_HOST")
}
pub fn port() -> u16 {
    env("PGQUE_TEST_PORT")
        .parse()
        .expect("PGQUE_TEST_PORT is a port number")
}
/// The server's bin directory (psql, pg_ctl).
pub fn bindir() -> String {
    env("PGQUE_TEST_BINDIR")
}
/// The server's data directory.
pub fn pgdata() -> String {
    env("PGQUE_TEST_PGDATA")
}
/// initdb's locale options for a cluster made as the tier's server was
/// (pg_test/run.sh: en_US.UTF-8 with the version's collation provider),
/// split into words; libc en_US.UTF-8 when run.sh did not say.
pub fn initdb_locale() -> Vec<String> {
    std::env::var("PGQUE_TEST_LOCALE_OPTS")
        .unwrap_or_else(|_| "--locale=en_US.UTF-8".to_string())
        .split_whitespace()
        .map(String::from)
        .collect()
}

/// The server's major version, e.g. 15.
pub fn major() -> u32 {
    env("PGQUE_TEST_PGVER")
        .parse()
        .expect("PGQUE_TEST_PGVER is a number")
}

pub fn conninfo(db: &str, user: &str) -> String {
    format!(
        "host={} port={} user={user} dbname={db} application_name=pgque_test",
        host(),
        port()
    )
}

/// Connects to `db` as the superuser `postgres`.
pub fn connect_to(db: &str) -> Client {
    connect_as(db, "postgres")
}

/// Connects to `db` as `user` (trust authentication on the test server).
pub fn connect_as(db: &str, user: &str) -> Client {
    let mut last = None;
    for _ in 0..50 {
        match Client::connect(&conninfo(db, user), NoTls) {
            Ok(c) => return c,
            Err(e) => {
                last = Some(e);
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    }
    panic!("cannot connect to {db} as {user}: {last:?}")
}

/// A fresh database with `CREATE EXTENSION pgque` done, named by the test.
pub struct TestDb {
    pub name: String,
}

/// A test's database is dropped when the test ends (also when it fails):
/// each database with pgque holds a background worker, and the test server
/// has a bounded number of worker slots (max_worker_processes; pgque tracks
/// at most 64 databases), so databases left behind by earlier test binaries
/// kept later ones from getting a worker.
impl Drop for TestDb {
    fn drop(&mut self) {
        // One attempt, never a panic: this may run while a failed test unwinds.
        if let Ok(mut admin) = Client::connect(&conninfo("postgres", "postgres"), NoTls) {
            let _ = admin.batch_execute(&format!(
                "DROP DATABASE IF EXISTS {} WITH (FORCE)",
                self.name
            ));
        }
    }
}

impl TestDb {
    /// Drops any leftover database of that name, creates it, installs pgque.
    pub fn new(name: &str) -> TestDb {
        Self::with_setup(name, true)
    }

    /// A fresh database without the extension.
    pub fn without_extension(name: &str) -> TestDb {
        Self::with_setup(name, false)
    }

    fn with_setup(name: &str, ext: bool) -> TestDb {
        assert!(name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_'));
        let mut admin = connect_to("postgres");
        admin
            .batch_execute(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
            .expect("drop old test database");
        admin
            .batch_execute(&format!("CREATE DATABASE {name}"))
            .expect("create test database");
        let db = TestDb {
            name: name.to_string(),
        };
        if ext {
            db.connect()
                .batch_execute("CREATE EXTENSION pgque")
                .expect("CREATE EXTENSION pgque");
        }
        db
    }

    /// A new connection (session) to this database as `postgres`.
    pub fn connect(&self) -> Client {
        connect_to(&self.name)
    }

    /// A new connection as another role (which must have LOGIN).
    pub fn connect_as(&self, user: &str) -> Client {
        connect_as(&self.name, user)
    }

    /// Runs psql on `sql` (fed on stdin) against this database; returns
    /// stdout and stderr interleaved as psql writes them.
    pub fn psql(&self, sql: &str, extra: &[&str]) -> String {
        use std::io::Write;
        let mut child = Command::new(format!("{}/psql", bindir()))
            .args([
                "-X",
                "-q",
                "-h",
                &host(),
                "-p",
                &port().to_string(),
                "-U",
                "postgres",
            ])
            .args(["-d", &self.name])
            .args(extra)
            .args(["-f", "-"])
            .env("PGAPPNAME", "pgque_regress")
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("run psql");
        child
            .stdin
            .take()
            .unwrap()
            .write_all(sql.as_bytes())
            .unwrap();
        let out = child.wait_with_output().expect("psql output");
        // psql writes errors to stderr; merge line by line is impossible after
        // the fact, so callers that compare output use `-a` plus `2>&1` via sh.
        let mut s = String::from_utf8_lossy(&out.stdout).into_owned();
        s.push_str(&String::from_utf8_lossy(&out.stderr));
        s
    }
}

/// Switches off the worker of the database `c` is connected to and waits (up
/// to 10 s: the tier's binaries run side by side) until it has left, so no
/// duty runs behind the test's back.
pub fn stop_worker(c: &mut Client) {
    c.batch_execute("SELECT pgque.stop()").unwrap();
    let gone = wait_until(Duration::from_secs(10), || {
        let n: i64 = c
            .query_one(
                "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'pgque worker' \
                   AND datname = current_database()",
                &[],
            )
            .unwrap()
            .get(0);
        n == 0
    });
    assert!(gone, "the pgque worker did not leave within 10 s of stop()");
}

/// Polls `f` every 20 ms until it returns true or `timeout` passes.
pub fn wait_until(timeout: Duration, mut f: impl FnMut() -> bool) -> bool {
    let start = Instant::now();
    loop {
        if f() {
            return true;
        }
        if start.elapsed() > timeout {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The SQLSTATE of a failed statement, or panics if it did not fail with a
/// server error.
pub fn sqlstate<T: std::fmt::Debug>(r: Result<T, postgres::Error>) -> String {
    match r {
        Ok(v) => panic!("expected an error, got {v:?}"),
        Err(e) => match e.code() {
            Some(c) => c.code().to_string(),
            None => panic!("expected a server error with a SQLSTATE, got {e}"),
        },
    }
}

/// Makes the stats collector's counters current (pg_stat_user_tables etc.)
/// for this session: PG 15+ keeps them in shared memory, flushed at most once
/// a second per backend, and caches them per transaction. PostgreSQL 14 has
/// a collector process instead: a backend sends its counters at the end of a
/// transaction at most every 500 ms, and a read asks the collector for a
/// file at most 500 ms old.
pub fn flush_stats(c: &mut Client) {
    std::thread::sleep(Duration::from_millis(1100));
    c.batch_execute("SELECT pg_stat_clear_snapshot()").unwrap();
    if major() >= 15 {
        // flushes this backend's own counters
        c.batch_execute("SELECT pg_stat_force_next_flush()")
            .unwrap();
    } else {
        // the transaction above sent this backend's counters (its last report
        // is over a second old); the collector takes them before this
        // session's next file request, and the snapshot is cleared again so
        // that the next read makes one
        std::thread::sleep(Duration::from_millis(600));
        c.batch_execute("SELECT pg_stat_clear_snapshot()").unwrap();
    }
}

/// A private PostgreSQL cluster for destructive tests (kill -9 of a backend,
/// `pg_ctl stop -m immediate`): same binaries and settings as the shared test
/// server (pgque preloaded), its own data directory and socket, so a crash
/// restart there does not disturb the tests running on the shared server.
/// Stopped and removed on drop.
pub struct Cluster {
    pub dir: String,
    pub port: u16,
    /// The binaries it runs with: the tier's version unless started with
    /// `start_new_at` (another major, for pg_upgrade).
    pub bindir: String,
}

fn as_postgres(cmd: &str, args: &[&str]) -> std::process::Output {
    let root = is_root();
    let mut c = if root {
        let mut c = Command::new("runuser");
        c.args(["-u", "postgres", "--", cmd]);
        c
    } else {
        Command::new(cmd)
    };
    c.args(args)
        .output()
        .unwrap_or_else(|e| panic!("run {cmd}: {e}"))
}

fn is_root() -> bool {
    // `id -u` avoids a libc dependency for one call.
    Command::new("id")
        .arg("-u")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
        .unwrap_or(false)
}

impl Cluster {
    /// Inits and starts a cluster named `name` (data in
    /// /tmp/pgque_priv_<major>_<name>, socket there too, port only names the
    /// socket). `extra_conf` lines are appended to postgresql.conf. As on the
    /// shared server (run.sh), the workers never go idle (pgque.idle_after =
    /// 0): the tests time duties on their active cadences; tests/idle.rs
    /// switches idle mode on in `extra_conf`.
    pub fn start_new(name: &str, extra_conf: &str) -> Cluster {
        Cluster::start_new_at(&bindir(), name, extra_conf)
    }

    /// As `start_new`, with the binaries in `bin` (another major version).
    /// A cluster of this server's major is made in the tier's locale
    /// ([`initdb_locale`]); one of another major in libc en_US.UTF-8, which
    /// every build here has (pg_upgrade between them wants the same).
    pub fn start_new_at(bin: &str, name: &str, extra_conf: &str) -> Cluster {
        let locale = if bin == bindir() {
            initdb_locale()
        } else {
            vec!["--locale=en_US.UTF-8".to_string()]
        };
        Cluster::start_new_with(bin, name, extra_conf, &locale)
    }

    /// As `start_new_at`, with initdb's locale options `locale`.
    pub fn start_new_with(bin: &str, name: &str, extra_conf: &str, locale: &[String]) -> Cluster {
        let mut cl = Cluster::named(name);
        cl.bindir = bin.to_string();
        cl.pg_ctl(&["stop", "-m", "immediate"]);
        let _ = std::fs::remove_dir_all(&cl.dir);
        std::fs::create_dir_all(&cl.dir).unwrap();
        if is_root() {
            let st = Command::new("chown")
                .args(["postgres", &cl.dir])
                .status()
                .unwrap();
            assert!(st.success());
        }
        let mut args: Vec<&str> = vec!["-D", &cl.dir, "-A", "trust", "-U", "postgres", "--no-sync"];
        args.extend(locale.iter().map(String::as_str));
        let out = as_postgres(&format!("{}/initdb", cl.bindir), &args);
        assert!(out.status.success(), "initdb: {out:?}");
        let conf = format!(
            "port = {}\nlisten_addresses = ''\nunix_socket_directories = '{}'\n\
             shared_preload_libraries = 'pgque'\nmax_worker_processes = 32\n\
             max_connections = 100\nfsync = off\nfull_page_writes = off\n\
             log_min_messages = log\nlog_line_prefix = '%m [%p] %b %d '\n\
             pgque.idle_after = 0\n{extra_conf}\n",
            cl.port, cl.dir
        );
        // The conf file belongs to postgres; append as postgres.
        let sh = format!("cat >> '{}/postgresql.conf' <<'CONF'\n{conf}CONF\n", cl.dir);
        let out = as_postgres("sh", &["-c", &sh]);
        assert!(out.status.success(), "write conf: {out:?}");
        cl.start();
        cl
    }

    /// The data directory (/tmp/pgque_priv_<major>_<name>) and port of the
    /// cluster named `name`; nothing is created.
    fn named(name: &str) -> Cluster {
        let dir = format!("/tmp/pgque_priv_{}_{name}", major());
        // Port: one per name, out of the shared servers' 54000+ range.
        let port = 56000
            + (name
                .bytes()
                .fold(0u32, |h, b| h.wrapping_mul(31).wrapping_add(b as u32))
                % 900) as u16;
        Cluster {
            dir,
            port,
            bindir: bindir(),
        }
    }

    /// A hot standby of this cluster, named `name` (its own data directory,
    /// socket and port, as start_new's): `pg_basebackup -R` (which writes
    /// standby.signal and primary_conninfo), then started; it streams from
    /// this cluster. `extra_conf` lines are appended to its postgresql.conf
    /// (after the primary's, which the backup copies). Stopped and removed
    /// on drop.
    pub fn start_standby(&self, name: &str, extra_conf: &str) -> Cluster {
        let mut sb = Cluster::named(name);
        sb.bindir = self.bindir.clone();
        sb.pg_ctl(&["stop", "-m", "immediate"]);
        let _ = std::fs::remove_dir_all(&sb.dir);
        let port = self.port.to_string();
        let out = as_postgres(
            &format!("{}/pg_basebackup", self.bindir),
            &[
                "-D",
                &sb.dir,
                "-h",
                &self.dir,
                "-p",
                &port,
                "-U",
                "postgres",
                "-R",
                "-X",
                "stream",
                "-c",
                "fast",
                "--no-sync",
            ],
        );
        assert!(out.status.success(), "pg_basebackup: {out:?}");
        let conf = format!(
            "port = {}\nunix_socket_directories = '{}'\nhot_standby = on\n{extra_conf}\n",
            sb.port, sb.dir
        );
        // -R's primary_conninfo (in postgresql.auto.conf, read last) names
        // every option the new libpq knows, sslnegotiation on 17+, which the
        // walreceiver refuses when the server runs with an older libpq (the
        // relocatable 18 here): replaced by the few this needs.
        let auto = format!(
            "primary_conninfo = 'host={} port={} user=postgres application_name={name}'\n",
            self.dir, self.port
        );
        let sh = format!(
            "cat >> '{0}/postgresql.conf' <<'CONF'\n{conf}CONF\n\
             cat >> '{0}/postgresql.auto.conf' <<'CONF'\n{auto}CONF\n",
            sb.dir
        );
        let out = as_postgres("sh", &["-c", &sh]);
        assert!(out.status.success(), "write standby conf: {out:?}");
        // the backup copied the primary's server.log (it lives in the data
        // directory): start() writes this cluster's own
        let _ = std::fs::remove_file(format!("{}/server.log", sb.dir));
        sb.start();
        sb
    }

    fn pg_ctl(&self, args: &[&str]) -> std::process::Output {
        let mut all = vec!["-D", &self.dir, "-w"];
        all.extend_from_slice(args);
        as_postgres(&format!("{}/pg_ctl", self.bindir), &all)
    }

    /// Starts the server (after a crash: crash recovery) and waits until it accepts connections.
    pub fn start(&self) {
        let log = format!("{}/server.log", self.dir);
        let out = self.pg_ctl(&["-l", &log, "start"]);
        assert!(out.status.success(), "pg_ctl start: {out:?}");
    }

    /// `pg_ctl restart -m fast`: a clean shutdown, then a start (shared
    /// memory and every background worker start afresh).
    pub fn restart(&self) {
        let log = format!("{}/server.log", self.dir);
        let out = self.pg_ctl(&["-l", &log, "-m", "fast", "restart"]);
        assert!(out.status.success(), "pg_ctl restart: {out:?}");
    }

    /// `pg_ctl stop -m fast`: a clean shutdown (what pg_upgrade wants of both clusters).
    pub fn stop_fast(&self) {
        let out = self.pg_ctl(&["stop", "-m", "fast"]);
        assert!(out.status.success(), "pg_ctl stop -m fast: {out:?}");
    }

    /// `pg_ctl stop -m immediate`: no checkpoint, the next start runs crash recovery.
    pub fn stop_immediate(&self) {
        let out = self.pg_ctl(&["stop", "-m", "immediate"]);
        assert!(out.status.success(), "pg_ctl stop -m immediate: {out:?}");
    }

    pub fn conninfo(&self, db: &str) -> String {
        format!(
            "host={} port={} user=postgres dbname={db} application_name=pgque_test",
            self.dir, self.port
        )
    }

    /// Connects, retrying for up to 60 s (the server may be in crash recovery).
    pub fn connect(&self, db: &str) -> Client {
        let mut last = None;
        for _ in 0..600 {
            match Client::connect(&self.conninfo(db), NoTls) {
                Ok(c) => return c,
                Err(e) => {
                    last = Some(e);
                    std::thread::sleep(Duration::from_millis(100));
                }
            }
        }
        panic!("cannot connect to {db} on the private cluster: {last:?}")
    }

    /// Connects to `db` as `user` (no retry: the server is up).
    pub fn connect_as(&self, db: &str, user: &str) -> Client {
        let info = self
            .conninfo(db)
            .replace("user=postgres", &format!("user={user}"));
        Client::connect(&info, NoTls)
            .unwrap_or_else(|e| panic!("connect to {db} as {user} on the private cluster: {e}"))
    }

    /// Creates database `db` with pgque installed (its worker starts).
    pub fn create_db(&self, db: &str) -> Client {
        let mut admin = self.connect("postgres");
        admin
            .batch_execute(&format!("CREATE DATABASE {db}"))
            .unwrap();
        let mut c = self.connect(db);
        c.batch_execute("CREATE EXTENSION pgque").unwrap();
        c
    }

    /// The last `n` lines of the server log (for failure messages).
    pub fn log_tail(&self, n: usize) -> String {
        let s = std::fs::read_to_string(format!("{}/server.log", self.dir)).unwrap_or_default();
        let lines: Vec<&str> = s.lines().collect();
        lines[lines.len().saturating_sub(n)..].join("\n")
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let out = self.pg_ctl(&["stop", "-m", "fast"]);
        if !out.status.success() {
            self.pg_ctl(&["stop", "-m", "immediate"]);
        }
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// SIGKILLs process `pid` (a backend: the postmaster then restarts every
/// process and the server runs crash recovery).
pub fn kill9(pid: i32) {
    let st = Command::new("kill")
        .args(["-9", &pid.to_string()])
        .status()
        .unwrap();
    assert!(st.success(), "kill -9 {pid}");
}
