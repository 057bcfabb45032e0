//! Which requests the dashboard answers at all. A page elsewhere on the web
//! can make a browser send requests here (a form, or a name of its own
//! DNS-rebound to 127.0.0.1); what it cannot choose is the `Host` its own
//! name puts in them, nor the `Origin` of its POSTs. So every request must
//! name this server in `Host`, and every POST must come from a page of this
//! server (`Origin`, or `Referer` when a browser sends no Origin).
use std::net::{IpAddr, Ipv6Addr, SocketAddr};

/// A host as requests name it: a lowercased DNS name or IP address (IPv6 in
/// brackets) and the port, when one is given.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Authority {
    pub name: String,
    pub port: Option<u16>,
}

impl std::fmt::Display for Authority {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.port {
            Some(p) => write!(f, "{}:{p}", self.name),
            None => write!(f, "{}", self.name),
        }
    }
}

/// Parses `NAME[:PORT]`, `IPv4[:PORT]` or `[IPv6][:PORT]` (a Host header,
/// the authority of an Origin, or an --allowed-host value). Returns the
/// lowercased authority, or what is wrong with it; user info, paths and
/// bare IPv6 addresses are refused rather than guessed at.
pub fn parse_authority(s: &str) -> Result<Authority, String> {
    if s.is_empty() {
        return Err("empty host".into());
    }
    let (name, port) = if let Some(rest) = s.strip_prefix('[') {
        let end = rest
            .find(']')
            .ok_or_else(|| format!("{s:?}: no closing ] after an IPv6 address"))?;
        let addr = &rest[..end];
        addr.parse::<Ipv6Addr>()
            .map_err(|_| format!("{s:?}: {addr:?} is not an IPv6 address"))?;
        let after = &rest[end + 1..];
        let port = match after.strip_prefix(':') {
            Some(p) => Some(p),
            None if after.is_empty() => None,
            None => return Err(format!("{s:?}: unexpected {after:?} after the address")),
        };
        (format!("[{}]", addr.to_ascii_lowercase()), port)
    } else {
        let (n, p) = match s.split_once(':') {
            Some((n, p)) => (n, Some(p)),
            None => (s, None),
        };
        if n.is_empty() {
            return Err(format!("{s:?}: no host name"));
        }
        if let Some(bad) = n
            .chars()
            .find(|c| !(c.is_ascii_alphanumeric() || *c == '-' || *c == '.' || *c == '_'))
        {
            return Err(format!(
                "{s:?}: {bad:?} cannot be in a host name (IPv6 addresses go in brackets)"
            ));
        }
        (n.to_ascii_lowercase(), p)
    };
    let port = match port {
        None => None,
        Some(p) => {
            if p.is_empty() || p.len() > 5 || !p.bytes().all(|b| b.is_ascii_digit()) {
                return Err(format!("{s:?}: {p:?} is not a port"));
            }
            match p.parse::<u16>() {
                Ok(v) if v > 0 => Some(v),
                _ => return Err(format!("{s:?}: {p:?} is not a port (1-65535)")),
            }
        }
    };
    Ok(Authority { name, port })
}

/// The scheme and authority of an absolute http(s) URL (an Origin header,
/// or a Referer, whose path is ignored), with the scheme's default port
/// filled in. None for anything else, `null` included.
pub fn parse_origin(url: &str) -> Option<Authority> {
    let (scheme, rest) = url.split_once("://")?;
    let default = match scheme.to_ascii_lowercase().as_str() {
        "http" => 80,
        "https" => 443,
        _ => return None,
    };
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let mut a = parse_authority(&rest[..end]).ok()?;
    a.port.get_or_insert(default);
    Some(a)
}

/// The names this server answers to.
#[derive(Clone, Debug)]
pub struct Allowed {
    /// A port of None matches the name on any port (an --allowed-host
    /// without one, as behind a proxy on 443).
    entries: Vec<Authority>,
}

impl Allowed {
    /// The names of a server listening on `listen`: its address and port
    /// (for 0.0.0.0 or [::], the loopback addresses), `localhost` on that
    /// port when loopback is reachable, and each of `extra` (--allowed-host
    /// values, NAME[:PORT]). Err names a bad --allowed-host value.
    pub fn new(listen: SocketAddr, extra: &[String]) -> Result<Allowed, String> {
        let port = Some(listen.port());
        let ip_name = |ip: IpAddr| match ip {
            IpAddr::V4(v) => v.to_string(),
            IpAddr::V6(v) => format!("[{v}]"),
        };
        let mut entries = Vec::new();
        let ip = listen.ip();
        if ip.is_unspecified() {
            for lo in ["127.0.0.1", "[::1]"] {
                entries.push(Authority {
                    name: lo.into(),
                    port,
                });
            }
        } else {
            entries.push(Authority {
                name: ip_name(ip),
                port,
            });
        }
        if ip.is_loopback() || ip.is_unspecified() {
            entries.push(Authority {
                name: "localhost".into(),
                port,
            });
        }
        for e in extra {
            let a = parse_authority(e.trim()).map_err(|m| format!("bad --allowed-host {m}"))?;
            if !entries.contains(&a) {
                entries.push(a);
            }
        }
        Ok(Allowed { entries })
    }

    fn matches(&self, a: &Authority, default_port: u16) -> bool {
        let port = a.port.unwrap_or(default_port);
        self.entries
            .iter()
            .any(|e| e.name == a.name && e.port.is_none_or(|p| p == port))
    }

    /// Whether a request's Host header names this server. `default_port`
    /// stands for a Host without a port (80, or 443 behind TLS).
    pub fn host_ok(&self, host: &str, default_port: u16) -> bool {
        parse_authority(host.trim()).is_ok_and(|a| self.matches(&a, default_port))
    }

    /// Whether an Origin (or Referer) URL is a page of this server.
    pub fn origin_ok(&self, url: &str) -> bool {
        parse_origin(url.trim()).is_some_and(|a| self.matches(&a, 0))
    }

    /// The names, for messages: `127.0.0.1:8080, localhost:8080`.
    pub fn describe(&self) -> String {
        self.entries
            .iter()
            .map(|e| e.to_string())
            .collect::<Vec<_>>()
            .join(", ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn auth(name: &str, port: Option<u16>) -> Authority {
        Authority {
            name: name.into(),
            port,
        }
    }

    #[test]
    fn authorities_parse_strictly() {
        assert_eq!(
            parse_authority("LocalHost:8080"),
            Ok(auth("localhost", Some(8080)))
        );
        assert_eq!(
            parse_authority("dash.example.com"),
            Ok(auth("dash.example.com", None))
        );
        assert_eq!(parse_authority("[::1]:9"), Ok(auth("[::1]", Some(9))));
        assert_eq!(parse_authority("[::1]"), Ok(auth("[::1]", None)));
        for bad in [
            "",
            ":80",
            "a:",
            "a:0",
            "a:65536",
            "a:8x",
            "::1",
            "[::1",
            "[nope]:1",
            "[::1]x",
            "user@host",
            "host/path",
            "a b",
            "a:1:2",
        ] {
            assert!(parse_authority(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn origins_get_their_default_port() {
        assert_eq!(
            parse_origin("http://127.0.0.1:8080"),
            Some(auth("127.0.0.1", Some(8080)))
        );
        assert_eq!(
            parse_origin("https://Dash.Example.com/jobs?x=1"),
            Some(auth("dash.example.com", Some(443)))
        );
        assert_eq!(
            parse_origin("http://a.test#frag"),
            Some(auth("a.test", Some(80)))
        );
        for bad in [
            "null",
            "",
            "ftp://a",
            "http://",
            "127.0.0.1:8080",
            "http://u@a",
        ] {
            assert_eq!(parse_origin(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn a_loopback_server_answers_to_its_address_and_localhost_only() {
        let a = Allowed::new("127.0.0.1:8080".parse().unwrap(), &[]).unwrap();
        assert_eq!(a.describe(), "127.0.0.1:8080, localhost:8080");
        assert!(a.host_ok("127.0.0.1:8080", 80));
        assert!(a.host_ok("localhost:8080", 80));
        assert!(a.host_ok("LOCALHOST:8080", 80));
        // A rebound name, another port, a missing port (80), garbage.
        for bad in [
            "evil.example:8080",
            "127.0.0.1:8081",
            "127.0.0.1",
            "localhost",
            "127.0.0.1:8080.evil",
            "",
        ] {
            assert!(!a.host_ok(bad, 80), "{bad:?} accepted");
        }
        assert!(a.origin_ok("http://127.0.0.1:8080"));
        assert!(a.origin_ok("http://localhost:8080/jobs"));
        assert!(!a.origin_ok("http://evil.example:8080"));
        assert!(!a.origin_ok("http://127.0.0.1"));
        assert!(!a.origin_ok("null"));
    }

    #[test]
    fn allowed_hosts_add_names_with_or_without_a_port() {
        let a = Allowed::new(
            "10.0.0.5:8080".parse().unwrap(),
            &["dash.example.com".into(), "other.test:9000".into()],
        )
        .unwrap();
        assert!(a.host_ok("10.0.0.5:8080", 80));
        assert!(
            !a.host_ok("localhost:8080", 80),
            "not listening on loopback"
        );
        assert!(a.host_ok("dash.example.com", 443));
        assert!(a.host_ok("dash.example.com:8080", 80));
        assert!(a.origin_ok("https://dash.example.com"));
        assert!(a.host_ok("other.test:9000", 80));
        assert!(!a.host_ok("other.test:9001", 80));
        assert!(!a.host_ok("other.test", 80));
        assert!(!a.origin_ok("https://other.test"));
        assert!(Allowed::new("10.0.0.5:8080".parse().unwrap(), &["bad host".into()]).is_err());
    }

    #[test]
    fn an_unspecified_address_answers_to_loopback_names() {
        let a = Allowed::new("0.0.0.0:8080".parse().unwrap(), &[]).unwrap();
        assert!(a.host_ok("127.0.0.1:8080", 80));
        assert!(a.host_ok("[::1]:8080", 80));
        assert!(a.host_ok("localhost:8080", 80));
        assert!(!a.host_ok("0.0.0.0:8080", 80));
        assert!(!a.host_ok("192.168.1.9:8080", 80));
        let v6 = Allowed::new("[::1]:8080".parse().unwrap(), &[]).unwrap();
        assert!(v6.host_ok("[::1]:8080", 80));
        assert!(v6.host_ok("localhost:8080", 80));
    }
}
