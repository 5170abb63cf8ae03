//! Turning [`DriverConfig::master`](crate::DriverConfig::master) into the
//! WebSocket URL of the master's scheduler endpoint: given directly, or
//! (feature `etcd`) the leading master recorded in etcd, as
//! `etcd://HOST:PORT/PREFIX`, followed by an
//! [`agora_discovery::MasterLocator`].

use agora_discovery::{DiscoveryError, MasterLocator};

pub(crate) use agora_discovery::LeaderChanged;

/// Where the driver finds the master.
#[derive(Debug)]
pub(crate) struct Endpoint {
    locator: MasterLocator,
}

// === impl Endpoint ===

impl Endpoint {
    /// `None` when `master` is neither `HOST:PORT`, a `ws://` URL nor
    /// (with the `etcd` feature) an `etcd://HOST:PORT/PREFIX` URL.
    pub(crate) fn parse(master: &str) -> Option<Endpoint> {
        if master.trim().starts_with("etcd://") {
            let locator = MasterLocator::new(master).ok()?;
            return Some(Endpoint { locator });
        }
        scheduler_url(master).map(|url| Endpoint {
            locator: MasterLocator::fixed(url),
        })
    }

    /// Whether the master is the leader followed in etcd.
    #[cfg(all(test, feature = "etcd"))]
    fn follows_a_leader(&self) -> bool {
        self.locator.follows_a_leader()
    }

    /// The URL to connect to now, and what tells the driver to leave it.
    /// `previous` is the URL the driver just lost or could not reach:
    /// through etcd, a different leader is awaited for a moment.
    pub(crate) async fn resolve(
        &self,
        previous: Option<&str>,
    ) -> Result<(String, LeaderChanged), String> {
        if !self.locator.follows_a_leader() {
            let located = self.locator.locate(previous).await.map_err(text)?;
            return Ok((located.address, located.changed));
        }
        let previous = previous.and_then(|p| {
            p.strip_prefix("ws://")
                .and_then(|p| p.strip_suffix(SCHEDULER_PATH))
        });
        let located = self.locator.locate(previous).await.map_err(text)?;
        Ok((
            format!("ws://{}{SCHEDULER_PATH}", located.address),
            located.changed,
        ))
    }
}

fn text(error: DiscoveryError) -> String {
    error.to_string()
}

impl std::fmt::Display for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.locator)
    }
}

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

    #[cfg(feature = "etcd")]
    #[test]
    fn etcd_urls_name_a_leader_to_follow() {
        let etcd = Endpoint::parse("etcd://127.0.0.1:2379/agora").unwrap();
        assert!(etcd.follows_a_leader());
        assert_eq!(etcd.to_string(), "etcd://127.0.0.1:2379/agora");
        assert!(Endpoint::parse("etcd://127.0.0.1:2379").is_none());
        let fixed = Endpoint::parse("127.0.0.1:5050").unwrap();
        assert!(!fixed.follows_a_leader());
        assert_eq!(fixed.to_string(), "ws://127.0.0.1:5050/api/scheduler");
    }

    #[cfg(not(feature = "etcd"))]
    #[test]
    fn etcd_urls_need_the_feature() {
        assert!(Endpoint::parse("etcd://127.0.0.1:2379/agora").is_none());
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
