//! The login: credentials (an auth file and/or environment variables, never
//! the command line, where `ps` shows them), server-side sessions named by a
//! random cookie, and a back-off on failed logins.
//!
//! Auth file format, one credential per line (blank lines and `#` comments
//! ignored):
//!
//! ```text
//! ROLE:NAME:SECRET
//! admin:alice:8f4c1b0e2a9d47c6b3e1f05a7d2c9e41
//! read:grafana-team:0d6e3a91c4b27f58e1a03c9d6b4f2e87
//! ```
//!
//! ROLE is `admin` (every page and the admin actions the database role
//! allows) or `read` (pages and /metrics only). NAME (letters, digits,
//! `.`, `_`, `-`) is what the logs and the page header show. SECRET is the
//! rest of the line, at least 16 characters. The file holds the secrets in
//! plain text, so it must be readable by its owner only (mode 0600 or
//! 0400): pgque-web refuses it otherwise. In memory only the SHA-256 of each
//! secret is kept, and a secret offered at login is hashed and compared with
//! every credential's hash in constant time.
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::path::Path;
use std::time::{Duration, Instant};

/// Shortest secret accepted: `openssl rand -hex 16` gives 32 characters.
pub const MIN_SECRET: usize = 16;
/// Longest secret looked at; longer input is refused before hashing.
pub const MAX_SECRET: usize = 1024;
/// Most sessions kept at once; the one expiring first makes room.
pub const MAX_SESSIONS: usize = 1000;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    Read,
    Admin,
}

impl Role {
    /// `admin` / `read`, as in the auth file.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Read => "read",
            Role::Admin => "admin",
        }
    }
}

/// One credential: who, with which role, and the hash of the secret.
#[derive(Clone, Debug)]
pub struct Credential {
    pub role: Role,
    pub name: String,
    digest: [u8; 32],
}

/// SHA-256 of a secret: what is kept and compared, so every comparison
/// is over 32 bytes whatever the secret's length.
pub fn digest(secret: &str) -> [u8; 32] {
    let d = Sha256::digest(secret.as_bytes());
    let mut out = [0u8; 32];
    out.copy_from_slice(&d);
    out
}

/// Equal without an early exit, so the time taken tells nothing of where
/// two values differ. Different lengths are unequal (the caller compares
/// fixed-length values: hashes, hex tokens of a known length).
pub fn ct_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    let d = a.iter().zip(b).fold(0u8, |d, (x, y)| d | (x ^ y));
    std::hint::black_box(d) == 0
}

/// 32 bytes from the operating system's CSPRNG, hex: session ids and
/// CSRF tokens.
pub fn random_hex() -> Result<String, String> {
    let mut b = [0u8; 32];
    getrandom::fill(&mut b).map_err(|e| format!("no random bytes from the system: {e}"))?;
    Ok(b.iter().map(|x| format!("{x:02x}")).collect())
}

fn check_secret(secret: &str, what: &str) -> Result<(), String> {
    let n = secret.chars().count();
    if n < MIN_SECRET {
        return Err(format!(
            "{what}: the secret has {n} characters, at least {MIN_SECRET} are needed (openssl rand -hex 16)"
        ));
    }
    if secret.len() > MAX_SECRET {
        return Err(format!(
            "{what}: the secret is longer than {MAX_SECRET} bytes"
        ));
    }
    if secret.trim() != secret || secret.chars().any(char::is_control) {
        return Err(format!(
            "{what}: the secret starts or ends with white space or holds a control character"
        ));
    }
    Ok(())
}

/// Parses an auth file's text (format in the module comment). Returns the
/// credentials, or the first bad line's number and what is wrong with it
/// (never the secret itself).
pub fn parse_auth_file(text: &str) -> Result<Vec<Credential>, String> {
    let mut out = Vec::new();
    for (i, raw) in text.lines().enumerate() {
        let line = raw.strip_suffix('\r').unwrap_or(raw);
        let where_ = format!("line {}", i + 1);
        if line.trim().is_empty() || line.trim_start().starts_with('#') {
            continue;
        }
        let mut parts = line.splitn(3, ':');
        let (Some(role), Some(name), Some(secret)) = (parts.next(), parts.next(), parts.next())
        else {
            return Err(format!("{where_}: expected ROLE:NAME:SECRET"));
        };
        let role = match role {
            "admin" => Role::Admin,
            "read" => Role::Read,
            other => {
                return Err(format!(
                    "{where_}: role {other:?} is neither \"admin\" nor \"read\""
                ))
            }
        };
        if name.is_empty()
            || name.len() > 64
            || !name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
        {
            return Err(format!(
                "{where_}: the name must be 1-64 letters, digits, '.', '_' or '-'"
            ));
        }
        check_secret(secret, &where_)?;
        out.push(Credential {
            role,
            name: name.to_string(),
            digest: digest(secret),
        });
    }
    Ok(out)
}

/// Reads an auth file: a regular file its owner alone may read (no group
/// or other permission bits), parsed by parse_auth_file. Err says what to
/// fix.
pub fn load_auth_file(path: &Path) -> Result<Vec<Credential>, String> {
    use std::os::unix::fs::PermissionsExt;
    let p = path.display();
    let meta = std::fs::metadata(path).map_err(|e| format!("--auth-file {p}: {e}"))?;
    if !meta.is_file() {
        return Err(format!("--auth-file {p}: not a regular file"));
    }
    let mode = meta.permissions().mode() & 0o777;
    if mode & 0o077 != 0 {
        return Err(format!(
            "--auth-file {p}: mode {mode:03o} lets other users read the secrets; chmod 600 {p}"
        ));
    }
    let text = std::fs::read_to_string(path).map_err(|e| format!("--auth-file {p}: {e}"))?;
    let creds = parse_auth_file(&text).map_err(|e| format!("--auth-file {p}, {e}"))?;
    if creds.is_empty() {
        return Err(format!("--auth-file {p}: no credentials in it"));
    }
    Ok(creds)
}

/// The credentials PGQUE_WEB_ADMIN_TOKEN and PGQUE_WEB_READ_TOKEN give
/// (named `admin-token` and `read-token`); unset or empty ones give none.
pub fn from_env(admin: Option<String>, read: Option<String>) -> Result<Vec<Credential>, String> {
    let mut out = Vec::new();
    for (var, role, name, v) in [
        ("PGQUE_WEB_ADMIN_TOKEN", Role::Admin, "admin-token", admin),
        ("PGQUE_WEB_READ_TOKEN", Role::Read, "read-token", read),
    ] {
        let Some(v) = v.filter(|v| !v.is_empty()) else {
            continue;
        };
        check_secret(&v, var)?;
        out.push(Credential {
            role,
            name: name.into(),
            digest: digest(&v),
        });
    }
    Ok(out)
}

/// Every credential this process accepts.
pub struct Credentials {
    list: Vec<Credential>,
}

impl Credentials {
    /// Refuses two credentials with one secret (a login could not tell
    /// them apart) or one name.
    pub fn new(list: Vec<Credential>) -> Result<Credentials, String> {
        for (i, a) in list.iter().enumerate() {
            for b in &list[..i] {
                if a.name == b.name {
                    return Err(format!("two credentials are named {:?}", a.name));
                }
                if a.digest == b.digest {
                    return Err(format!(
                        "credentials {:?} and {:?} have the same secret",
                        b.name, a.name
                    ));
                }
            }
        }
        Ok(Credentials { list })
    }

    /// No credential at all (then there is no login).
    pub fn is_empty(&self) -> bool {
        self.list.is_empty()
    }

    /// How many credentials have `role`.
    pub fn count(&self, role: Role) -> usize {
        self.list.iter().filter(|c| c.role == role).count()
    }

    /// The credential whose secret this is. Every credential is compared
    /// (no early exit), each in constant time, so timing says nothing of
    /// which one matched or how close a guess came.
    pub fn check(&self, secret: &str) -> Option<&Credential> {
        if secret.is_empty() || secret.len() > MAX_SECRET {
            return None;
        }
        let d = digest(secret);
        let mut found = None;
        for c in &self.list {
            if ct_eq(&c.digest, &d) {
                found = Some(c);
            }
        }
        found
    }
}

/// A logged-in browser.
#[derive(Clone, Debug)]
pub struct Session {
    pub role: Role,
    pub name: String,
    /// The CSRF token of this session's forms.
    pub csrf: String,
    pub expires: Instant,
}

/// Sessions by the SHA-256 of their id, so what is kept in memory cannot
/// itself be replayed as a cookie.
pub struct Sessions {
    ttl: Duration,
    map: HashMap<[u8; 32], Session>,
}

impl Sessions {
    /// No sessions yet; each will last `ttl` from its login.
    pub fn new(ttl: Duration) -> Sessions {
        Sessions {
            ttl,
            map: HashMap::new(),
        }
    }

    /// Starts a session for `cred` lasting the ttl from `now`. Returns its
    /// id (the cookie's value) and the session. Drops expired sessions and,
    /// at MAX_SESSIONS, the one expiring first.
    pub fn create(&mut self, cred: &Credential, now: Instant) -> Result<(String, Session), String> {
        self.map.retain(|_, s| s.expires > now);
        if self.map.len() >= MAX_SESSIONS {
            if let Some(k) = self
                .map
                .iter()
                .min_by_key(|(_, s)| s.expires)
                .map(|(k, _)| *k)
            {
                self.map.remove(&k);
            }
        }
        let id = random_hex()?;
        let s = Session {
            role: cred.role,
            name: cred.name.clone(),
            csrf: random_hex()?,
            expires: now + self.ttl,
        };
        self.map.insert(digest(&id), s.clone());
        Ok((id, s))
    }

    /// The live session of a cookie value; an expired one is removed.
    pub fn get(&mut self, id: &str, now: Instant) -> Option<Session> {
        let k = digest(id);
        match self.map.get(&k) {
            Some(s) if s.expires > now => Some(s.clone()),
            Some(_) => {
                self.map.remove(&k);
                None
            }
            None => None,
        }
    }

    /// Ends a session (logout).
    pub fn remove(&mut self, id: &str) {
        self.map.remove(&digest(id));
    }

    /// Sessions kept (expired ones go at the next create or lookup).
    pub fn live(&self) -> usize {
        self.map.len()
    }

    /// How long a session lasts from its login.
    pub fn ttl(&self) -> Duration {
        self.ttl
    }
}

/// Failed attempts allowed before any wait.
const FREE_FAILURES: u32 = 3;
/// Longest wait between attempts.
const MAX_WAIT: Duration = Duration::from_secs(60);
/// Failures older than this are forgotten.
const FORGET_AFTER: Duration = Duration::from_secs(900);

/// A per-process back-off on failed logins: after FREE_FAILURES failures
/// each further one doubles the wait before the next attempt is looked at
/// (1 s, 2 s, 4 s ... up to a minute); failures are forgotten after 15
/// quiet minutes, not by a success (a reader who knows the read token must
/// not reset the count while guessing the admin one). One counter for every
/// client: it slows guessing from anywhere, at the price that a guesser
/// also delays real logins (never by more than a minute at a time).
#[derive(Default)]
pub struct Backoff {
    failures: u32,
    last: Option<Instant>,
    until: Option<Instant>,
}

impl Backoff {
    /// How long until an attempt is looked at again (None: now).
    pub fn wait(&self, now: Instant) -> Option<Duration> {
        self.until
            .filter(|u| *u > now)
            .map(|u| u.duration_since(now))
    }

    /// Counts a failure at `now` and sets the next wait.
    pub fn failed(&mut self, now: Instant) {
        if self
            .last
            .is_some_and(|l| now.duration_since(l) > FORGET_AFTER)
        {
            self.failures = 0;
        }
        self.failures = self.failures.saturating_add(1);
        self.last = Some(now);
        if self.failures > FREE_FAILURES {
            let exp = (self.failures - FREE_FAILURES - 1).min(16);
            let wait = Duration::from_secs(1u64 << exp).min(MAX_WAIT);
            self.until = Some(now + wait);
        }
    }
}

/// The session cookie's name. It carries the listening port because
/// browsers share cookies between the ports of one host: two dashboards on
/// one machine would otherwise log each other out.
pub fn cookie_name(port: u16) -> String {
    format!("pgque_session_{port}")
}

/// The Set-Cookie value that starts a session: HttpOnly (no script reads
/// it), SameSite=Strict (no other site's request carries it), Path=/, and
/// Secure when the dashboard is served over TLS (--cookie-secure).
pub fn set_cookie(name: &str, id: &str, max_age: Duration, secure: bool) -> String {
    format!(
        "{name}={id}; HttpOnly; SameSite=Strict; Path=/; Max-Age={}{}",
        max_age.as_secs(),
        if secure { "; Secure" } else { "" }
    )
}

/// The Set-Cookie value that removes the session cookie (logout).
pub fn clear_cookie(name: &str, secure: bool) -> String {
    set_cookie(name, "", Duration::ZERO, secure)
}

/// A cookie's value in a Cookie header (`a=1; b=2`).
pub fn cookie_value<'a>(header: &'a str, name: &str) -> Option<&'a str> {
    header
        .split(';')
        .filter_map(|kv| kv.trim().split_once('='))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v.trim())
}

#[cfg(test)]
mod tests {
    use super::*;

    const S1: &str = "0123456789abcdef-one";
    const S2: &str = "0123456789abcdef-two";

    #[test]
    fn auth_files_parse_and_bad_lines_are_named() {
        let c = parse_auth_file(&format!(
            "# who may log in\n\nadmin:alice:{S1}\r\nread:grafana.team:{S2}:with:colons\n"
        ))
        .unwrap();
        assert_eq!(c.len(), 2);
        assert_eq!((c[0].role, c[0].name.as_str()), (Role::Admin, "alice"));
        assert_eq!(
            (c[1].role, c[1].name.as_str()),
            (Role::Read, "grafana.team")
        );
        let creds = Credentials::new(c).unwrap();
        assert_eq!(creds.check(S1).map(|c| c.role), Some(Role::Admin));
        assert_eq!(
            creds.check(&format!("{S2}:with:colons")).map(|c| c.role),
            Some(Role::Read)
        );
        assert!(creds.check(S2).is_none());
        assert!(creds.check("").is_none());
        assert!(creds.check(&"x".repeat(MAX_SECRET + 1)).is_none());
        for (text, want) in [
            ("admin:alice", "line 1: expected ROLE:NAME:SECRET"),
            (&format!("\nroot:alice:{S1}"), "line 2: role \"root\""),
            (&format!("admin::{S1}"), "line 1: the name"),
            (&format!("admin:a b:{S1}"), "line 1: the name"),
            ("admin:alice:short", "line 1: the secret has 5 characters"),
            (&format!("admin:alice: {S1}"), "white space"),
        ] {
            let e = parse_auth_file(text).unwrap_err();
            assert!(e.starts_with(want) || e.contains(want), "{text:?}: {e}");
            assert!(!e.contains(S1), "the error shows the secret: {e}");
        }
    }

    #[test]
    fn duplicate_names_and_secrets_are_refused() {
        let twice = parse_auth_file(&format!("admin:a:{S1}\nread:b:{S1}\n")).unwrap();
        assert!(Credentials::new(twice)
            .err()
            .unwrap()
            .contains("same secret"));
        let named = parse_auth_file(&format!("admin:a:{S1}\nread:a:{S2}\n")).unwrap();
        assert!(Credentials::new(named).err().unwrap().contains("named"));
    }

    #[test]
    fn auth_files_readable_by_others_are_refused() {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("pgque_web_auth_{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("auth");
        std::fs::write(&f, format!("admin:alice:{S1}\n")).unwrap();
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o644)).unwrap();
        let e = load_auth_file(&f).unwrap_err();
        assert!(e.contains("mode 644") && e.contains("chmod 600"), "{e}");
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert_eq!(load_auth_file(&f).unwrap().len(), 1);
        std::fs::write(&f, "# nobody\n").unwrap();
        assert!(load_auth_file(&f).unwrap_err().contains("no credentials"));
        assert!(load_auth_file(&dir.join("missing")).is_err());
        assert!(load_auth_file(&dir)
            .unwrap_err()
            .contains("not a regular file"));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn environment_tokens() {
        let c = from_env(Some(S1.into()), Some(String::new())).unwrap();
        assert_eq!(c.len(), 1);
        assert_eq!(
            (c[0].role, c[0].name.as_str()),
            (Role::Admin, "admin-token")
        );
        let e = from_env(None, Some("short".into())).unwrap_err();
        assert!(e.starts_with("PGQUE_WEB_READ_TOKEN"), "{e}");
        assert!(from_env(None, None).unwrap().is_empty());
    }

    #[test]
    fn comparisons_are_whole_and_over_hashes() {
        assert!(ct_eq(b"abc", b"abc"));
        assert!(!ct_eq(b"abc", b"abd"));
        assert!(!ct_eq(b"abc", b"ab"));
        assert!(ct_eq(b"", b""));
        // What is kept is the hash, never the secret.
        let c = &parse_auth_file(&format!("admin:a:{S1}")).unwrap()[0];
        assert_eq!(c.digest, digest(S1));
        assert!(!format!("{c:?}").contains(S1));
        let a = random_hex().unwrap();
        assert_eq!(a.len(), 64);
        assert!(a.bytes().all(|b| b.is_ascii_hexdigit()));
        assert_ne!(a, random_hex().unwrap());
    }

    #[test]
    fn sessions_expire_and_end_at_logout() {
        let cred = &parse_auth_file(&format!("read:r:{S1}")).unwrap()[0];
        let mut s = Sessions::new(Duration::from_secs(60));
        let t0 = Instant::now();
        let (id, sess) = s.create(cred, t0).unwrap();
        assert_eq!(id.len(), 64);
        assert_eq!(sess.csrf.len(), 64);
        assert_ne!(id, sess.csrf);
        assert_eq!(
            s.get(&id, t0 + Duration::from_secs(59)).unwrap().role,
            Role::Read
        );
        assert!(s.get("0".repeat(64).as_str(), t0).is_none());
        assert!(
            s.get(&id, t0 + Duration::from_secs(60)).is_none(),
            "expired"
        );
        assert_eq!(s.live(), 0, "an expired session is dropped");
        let (id2, _) = s.create(cred, t0).unwrap();
        assert_ne!(id, id2);
        s.remove(&id2);
        assert!(s.get(&id2, t0).is_none());
    }

    #[test]
    fn sessions_are_capped() {
        let cred = &parse_auth_file(&format!("read:r:{S1}")).unwrap()[0];
        let mut s = Sessions::new(Duration::from_secs(60));
        let t0 = Instant::now();
        let (first, _) = s.create(cred, t0).unwrap();
        for i in 1..=MAX_SESSIONS {
            s.create(cred, t0 + Duration::from_millis(i as u64))
                .unwrap();
        }
        assert_eq!(s.live(), MAX_SESSIONS);
        assert!(s.get(&first, t0).is_none(), "the oldest made room");
    }

    #[test]
    fn failed_logins_back_off() {
        let mut b = Backoff::default();
        let t = Instant::now();
        for i in 0..FREE_FAILURES {
            assert_eq!(b.wait(t), None, "failure {i}");
            b.failed(t);
        }
        assert_eq!(b.wait(t), None);
        b.failed(t);
        assert_eq!(b.wait(t), Some(Duration::from_secs(1)));
        b.failed(t);
        assert_eq!(b.wait(t), Some(Duration::from_secs(2)));
        for _ in 0..20 {
            b.failed(t);
        }
        assert_eq!(b.wait(t), Some(MAX_WAIT));
        assert_eq!(b.wait(t + MAX_WAIT), None);
        // Long after, failures are forgotten.
        let later = t + FORGET_AFTER + Duration::from_secs(1);
        b.failed(later);
        assert_eq!(b.wait(later), None);
    }

    #[test]
    fn cookies_carry_the_flags() {
        let n = cookie_name(8080);
        assert_eq!(n, "pgque_session_8080");
        let c = set_cookie(&n, "abc", Duration::from_secs(3600), false);
        assert_eq!(
            c,
            "pgque_session_8080=abc; HttpOnly; SameSite=Strict; Path=/; Max-Age=3600"
        );
        assert!(set_cookie(&n, "abc", Duration::from_secs(1), true).ends_with("; Secure"));
        assert!(
            clear_cookie(&n, false).contains("=; HttpOnly")
                && clear_cookie(&n, false).contains("Max-Age=0")
        );
        assert_eq!(
            cookie_value("a=1; pgque_session_8080=abc ; b=2", &n),
            Some("abc")
        );
        assert_eq!(cookie_value("pgque_session_8081=abc", &n), None);
        assert_eq!(cookie_value("", &n), None);
    }
}
