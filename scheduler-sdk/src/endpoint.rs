//! Turning [`DriverConfig::master`](crate::DriverConfig::master) into the
//! WebSocket URL of the master's scheduler endpoint: given directly, or
//! (feature `etcd`) read from etcd before every connection attempt, as
//! `etcd://HOST:PORT/PREFIX`, to follow the leading master.

use std::future::Future;
use std::pin::Pin;
#[cfg(feature = "etcd")]
use std::time::Duration;

/// How often a connected driver checks etcd for a leader change.
#[cfg(feature = "etcd")]
const LEADER_CHECK: Duration = Duration::from_millis(500);

/// How long a driver that lost a master waits for etcd to name another.
#[cfg(feature = "etcd")]
const NEW_LEADER_PATIENCE: Duration = Duration::from_secs(1);

/// Completes when the master the driver is connected to stops leading.
pub(crate) type LeaderChanged = Pin<Box<dyn Future<Output = ()> + Send>>;

/// Where the driver finds the master.
#[derive(Debug, Clone)]
pub(crate) enum Endpoint {
    /// A fixed `ws://` URL.
    Url(String),
    /// The leader recorded in etcd.
    #[cfg(feature = "etcd")]
    Etcd(agora_proto::etcd::EtcdUrl),
}

// === impl Endpoint ===

impl Endpoint {
    /// `None` when `master` is neither `HOST:PORT`, a `ws://` URL nor
    /// (with the `etcd` feature) an `etcd://HOST:PORT/PREFIX` URL.
    pub(crate) fn parse(master: &str) -> Option<Endpoint> {
        #[cfg(feature = "etcd")]
        if let Some(url) = agora_proto::etcd::EtcdUrl::parse(master) {
            return url.ok().map(Endpoint::Etcd);
        }
        scheduler_url(master).map(Endpoint::Url)
    }

    /// The URL to connect to now, and what tells the driver to leave it.
    /// `previous` is the URL the driver just lost or could not reach:
    /// through etcd, a different leader is awaited for a moment.
    pub(crate) async fn resolve(
        &self,
        previous: Option<&str>,
    ) -> Result<(String, LeaderChanged), String> {
        match self {
            Endpoint::Url(url) => {
                let _ = previous;
                Ok((url.clone(), Box::pin(std::future::pending())))
            }
            #[cfg(feature = "etcd")]
            Endpoint::Etcd(url) => {
                let previous = previous.and_then(|p| {
                    p.strip_prefix("ws://")
                        .and_then(|p| p.strip_suffix(SCHEDULER_PATH))
                });
                let detected =
                    agora_proto::etcd::detect_new_leader(url, previous, NEW_LEADER_PATIENCE).await;
                match detected {
                    Ok(Some(leader)) => {
                        let (etcd, address) = (url.clone(), leader.address.clone());
                        let changed = async move {
                            agora_proto::etcd::leader_changed(&etcd, &address, LEADER_CHECK).await
                        };
                        Ok((
                            format!("ws://{}{SCHEDULER_PATH}", leader.address),
                            Box::pin(changed),
                        ))
                    }
                    Ok(None) => Err(format!("no leading master in {url} yet")),
                    Err(e) => Err(e.to_string()),
                }
            }
        }
    }
}

impl std::fmt::Display for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Endpoint::Url(url) => f.write_str(url),
            #[cfg(feature = "etcd")]
            Endpoint::Etcd(url) => write!(f, "{url}"),
        }
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
    fn etcd_urls_name_a_detector() {
        assert!(matches!(
            Endpoint::parse("etcd://127.0.0.1:2379/agora"),
            Some(Endpoint::Etcd(url)) if url.prefix == "/agora"
        ));
        assert!(Endpoint::parse("etcd://127.0.0.1:2379").is_none());
        assert!(matches!(
            Endpoint::parse("127.0.0.1:5050"),
            Some(Endpoint::Url(url)) if url == "ws://127.0.0.1:5050/api/scheduler"
        ));
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
