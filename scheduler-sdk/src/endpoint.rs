//! Turning [`DriverConfig::master`](crate::DriverConfig::master) into the
//! WebSocket URL of the master's scheduler endpoint.

/// Path of the scheduler endpoint on the master.
pub(crate) const SCHEDULER_PATH: &str = "/api/scheduler";

/// `HOST:PORT` → `ws://HOST:PORT/api/scheduler`; a `ws://` URL is kept
/// (with `/api/scheduler` appended when it has no path). `None` for
/// anything else.
pub(crate) fn scheduler_url(master: &str) -> Option<String> {
    let master = master.trim();
    if let Some(rest) = master.strip_prefix("ws://") {
        let (authority, path) = match rest.find('/') {
            Some(i) => (&rest[..i], &rest[i..]),
            None => (rest, ""),
        };
        if !valid_authority(authority) || path.chars().any(char::is_whitespace) {
            return None;
        }
        let path = if path.is_empty() || path == "/" {
            SCHEDULER_PATH
        } else {
            path
        };
        return Some(format!("ws://{authority}{path}"));
    }
    if master.contains("://") || !valid_authority(master) {
        return None;
    }
    Some(format!("ws://{master}{SCHEDULER_PATH}"))
}

/// `HOST:PORT` with a non-empty host (a name, IPv4 or bracketed IPv6) and
/// a non-zero numeric port.
fn valid_authority(authority: &str) -> bool {
    let Some((host, port)) = authority.rsplit_once(':') else {
        return false;
    };
    let port_ok = matches!(port.parse::<u16>(), Ok(p) if p != 0);
    let host_ok = if let Some(inner) = host.strip_prefix('[') {
        inner
            .strip_suffix(']')
            .is_some_and(|ip| ip.parse::<std::net::Ipv6Addr>().is_ok())
    } else {
        !host.is_empty()
            && host
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '.' || c == '-' || c == '_')
    };
    port_ok && host_ok
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_port_becomes_scheduler_url() {
        assert_eq!(
            scheduler_url("127.0.0.1:5050").as_deref(),
            Some("ws://127.0.0.1:5050/api/scheduler")
        );
        assert_eq!(
            scheduler_url("master.example:5050").as_deref(),
            Some("ws://master.example:5050/api/scheduler")
        );
        assert_eq!(
            scheduler_url("[::1]:5050").as_deref(),
            Some("ws://[::1]:5050/api/scheduler")
        );
    }

    #[test]
    fn ws_urls_are_accepted() {
        assert_eq!(
            scheduler_url("ws://h:1/api/scheduler").as_deref(),
            Some("ws://h:1/api/scheduler")
        );
        assert_eq!(
            scheduler_url("ws://h:1").as_deref(),
            Some("ws://h:1/api/scheduler")
        );
        assert_eq!(
            scheduler_url("ws://h:1/custom").as_deref(),
            Some("ws://h:1/custom")
        );
    }

    #[test]
    fn garbage_is_rejected() {
        for bad in [
            "",
            "localhost",
            "host:",
            ":5050",
            "host:0",
            "host:99999",
            "http://host:5050",
            "etcd://zk/agora",
            "ho st:5050",
            "ws://",
            "ws://host",
            "[::1:5050",
        ] {
            assert_eq!(scheduler_url(bad), None, "{bad:?} should be rejected");
        }
    }
}
