//! Following the leader recorded in etcd (feature `etcd`).
//!
//! In high-availability mode every master campaigns for `PREFIX/leader`
//! (see `docs/protocol.md`, "High availability"); the winner writes a
//! [`LeaderInfo`] there, attached to its lease. A [`LeaderWatch`] reads
//! the key once and then watches it: etcd pushes every change over one
//! long-lived request, so an idle client costs etcd nothing, and a client
//! hears of a new leader (or of none, when the old one's lease ran out)
//! as soon as etcd knows. When the watch breaks, the key is read again
//! and watched anew, with backoff and jitter; after
//! [`LEADER_UNREACHABLE_AFTER`] failures in a row, clients are told to
//! leave their master (it cannot hold its lease either).

use std::sync::Mutex;
use std::time::Duration;

use agora_proto::LeaderInfo;
use tokio::sync::watch;
use tokio::time::Instant;

use crate::{random_sample, Backoff, DiscoveryError, LeaderChanged, Located};

/// How long a client that lost a master waits for etcd to name another
/// before it takes the same one again.
pub const NEW_LEADER_PATIENCE: Duration = Duration::from_secs(1);
/// Failed reads (or watches) in a row after which etcd counts as
/// unreachable and clients leave their master.
pub const LEADER_UNREACHABLE_AFTER: u32 = 3;
/// How long a first [`MasterLocator::locate`](crate::MasterLocator::locate)
/// waits for the first read of the key.
const FIRST_READ_WAIT: Duration = Duration::from_secs(5);
/// Backoff between attempts to read and watch the key again.
const REWATCH_MIN: Duration = Duration::from_millis(100);
const REWATCH_MAX: Duration = Duration::from_secs(2);

/// `etcd://HOST:PORT/PREFIX`: where to find the current leader.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EtcdUrl {
    /// `HOST:PORT` of etcd.
    pub endpoint: String,
    /// Key prefix, starting with `/`, without a trailing `/`.
    pub prefix: String,
}

/// What the follower task knows of the key.
#[derive(Debug, Clone, PartialEq)]
enum Seen {
    /// Not read yet.
    Reading,
    /// The key as last read or watched.
    Leader(Option<LeaderInfo>),
    /// etcd could not be read, [`LEADER_UNREACHABLE_AFTER`] times in a
    /// row.
    Unreachable(String),
}

/// The leader key of one `etcd://` URL, followed by a background task
/// started on first use and ended when the watch and every
/// [`Located::changed`] it handed out are dropped.
pub(crate) struct LeaderWatch {
    url: EtcdUrl,
    client: agora_etcd::Client,
    seen: Mutex<Option<watch::Receiver<Seen>>>,
}

/// `PREFIX/leader`.
pub fn leader_key(prefix: &str) -> String {
    format!("{}/leader", prefix.trim_end_matches('/'))
}

// === impl EtcdUrl ===

impl EtcdUrl {
    /// Parses `etcd://HOST:PORT/PREFIX`.
    pub fn parse(text: &str) -> Result<EtcdUrl, DiscoveryError> {
        let invalid = || DiscoveryError::InvalidEtcdUrl(text.to_string());
        let rest = text.trim().strip_prefix("etcd://").ok_or_else(invalid)?;
        let (endpoint, prefix) = rest.split_once('/').ok_or_else(invalid)?;
        let prefix = format!("/{}", prefix.trim_end_matches('/'));
        let valid_endpoint = matches!(endpoint.rsplit_once(':'), Some((host, port))
            if !host.is_empty() && matches!(port.parse::<u16>(), Ok(p) if p != 0));
        if prefix == "/" || !valid_endpoint {
            return Err(invalid());
        }
        Ok(EtcdUrl {
            endpoint: endpoint.to_string(),
            prefix,
        })
    }

    /// The key the leader's [`LeaderInfo`] is stored under.
    pub fn leader_key(&self) -> String {
        leader_key(&self.prefix)
    }
}

impl std::fmt::Display for EtcdUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "etcd://{}{}", self.endpoint, self.prefix)
    }
}

// === impl LeaderWatch ===

impl LeaderWatch {
    pub(crate) fn new(url: EtcdUrl) -> Result<LeaderWatch, DiscoveryError> {
        let client = agora_etcd::Client::new(&url.endpoint)
            .map_err(|_| DiscoveryError::InvalidEtcdUrl(url.to_string()))?;
        Ok(LeaderWatch {
            url,
            client,
            seen: Mutex::new(None),
        })
    }

    pub(crate) fn url(&self) -> &EtcdUrl {
        &self.url
    }

    /// The follower's view, starting the follower on first use (or
    /// again, if it ended).
    fn seen(&self) -> watch::Receiver<Seen> {
        let mut slot = self
            .seen
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(rx) = slot.as_ref().filter(|rx| rx.has_changed().is_ok()) {
            return rx.clone();
        }
        let (tx, rx) = watch::channel(Seen::Reading);
        tokio::spawn(follow(
            self.client.clone(),
            self.url.leader_key(),
            self.url.to_string(),
            tx,
        ));
        *slot = Some(rx.clone());
        rx
    }

    pub(crate) async fn locate(&self, previous: Option<&str>) -> Result<Located, DiscoveryError> {
        let mut seen = self.seen();
        let started = Instant::now();
        let patience = started + previous.map_or(Duration::ZERO, |_| NEW_LEADER_PATIENCE);
        let first_read = started + FIRST_READ_WAIT;
        loop {
            let now = Instant::now();
            let current = seen.borrow_and_update().clone();
            let until = match current {
                Seen::Leader(Some(leader))
                    if previous != Some(leader.address.as_str()) || now >= patience =>
                {
                    return Ok(Located {
                        changed: changed(seen, leader.address.clone()),
                        address: leader.address,
                    });
                }
                Seen::Leader(None) if now >= patience => {
                    return Err(DiscoveryError::NoLeader(self.url.to_string()))
                }
                Seen::Leader(_) => patience,
                Seen::Unreachable(reason) => {
                    return Err(DiscoveryError::Unreachable {
                        url: self.url.to_string(),
                        reason,
                    })
                }
                Seen::Reading if now >= first_read => {
                    return Err(DiscoveryError::Unreachable {
                        url: self.url.to_string(),
                        reason: format!("no answer within {FIRST_READ_WAIT:?}"),
                    })
                }
                Seen::Reading => first_read,
            };
            tokio::select! {
                changed = seen.changed() => if changed.is_err() {
                    return Err(DiscoveryError::Unreachable {
                        url: self.url.to_string(),
                        reason: "the leader watch ended".into(),
                    });
                },
                _ = tokio::time::sleep_until(until) => {}
            }
        }
    }
}

/// Completes once `seen` shows a leader other than `address`.
fn changed(mut seen: watch::Receiver<Seen>, address: String) -> LeaderChanged {
    Box::pin(async move {
        loop {
            let now = seen.borrow_and_update().clone();
            match now {
                Seen::Leader(Some(leader)) if leader.address == address => {}
                Seen::Reading => {}
                other => {
                    let leader = match other {
                        Seen::Leader(l) => format!("{:?}", l.map(|l| l.address)),
                        _ => "unknown (etcd unreachable)".into(),
                    };
                    tracing::info!(%leader, was = %address, "the leader changed");
                    return;
                }
            }
            if seen.changed().await.is_err() {
                return;
            }
        }
    })
}

/// Reads `key`, then watches it from the next revision, publishing what
/// it holds; starts over (with backoff and jitter) when the watch breaks.
/// Ends when nobody looks any more.
async fn follow(client: agora_etcd::Client, key: String, url: String, tx: watch::Sender<Seen>) {
    let mut backoff = Backoff::new(REWATCH_MIN, REWATCH_MAX, crate::DEFAULT_JITTER);
    let mut failures = 0u32;
    let publish = |seen: Seen| {
        tx.send_if_modified(|current| {
            let modified = *current != seen;
            *current = seen;
            modified
        });
    };
    loop {
        let session = async {
            let (kv, revision) = client.get_at(key.as_bytes()).await?;
            publish(Seen::Leader(kv.and_then(|kv| leader(&url, &kv.value))));
            let mut watch = client.watch(key.as_bytes(), revision + 1).await?;
            // Read and watching: a later break starts a fresh count.
            failures = 0;
            backoff.reset();
            while let Some(events) = watch.next().await? {
                for event in events {
                    publish(Seen::Leader(match event.kind {
                        agora_etcd::EventKind::Put => leader(&url, &event.kv.value),
                        agora_etcd::EventKind::Delete => None,
                    }));
                }
            }
            Ok::<(), agora_etcd::EtcdError>(())
        };
        let ended = tokio::select! {
            ended = session => ended,
            _ = tx.closed() => return,
        };
        match ended {
            Ok(()) => tracing::debug!(%url, "the leader watch ended; watching again"),
            Err(e) => {
                failures += 1;
                tracing::debug!(%url, error = %e, failures, "cannot follow the leader");
                if failures >= LEADER_UNREACHABLE_AFTER {
                    if failures == LEADER_UNREACHABLE_AFTER {
                        tracing::warn!(%url, error = %e, "cannot read the leading master from etcd");
                    }
                    publish(Seen::Unreachable(e.to_string()));
                }
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(backoff.next_delay(random_sample())) => {}
            _ = tx.closed() => return,
        }
    }
}

fn leader(url: &str, value: &[u8]) -> Option<LeaderInfo> {
    match serde_json::from_slice(value) {
        Ok(leader) => Some(leader),
        Err(e) => {
            tracing::warn!(%url, error = %e, "unreadable leader record; taken as no leader");
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn etcd_urls_parse() {
        let url = EtcdUrl::parse("etcd://127.0.0.1:2379/agora").unwrap();
        assert_eq!(url.endpoint, "127.0.0.1:2379");
        assert_eq!(url.prefix, "/agora");
        assert_eq!(url.leader_key(), "/agora/leader");
        assert_eq!(url.to_string(), "etcd://127.0.0.1:2379/agora");
        assert_eq!(leader_key("/a/"), "/a/leader");
        for bad in [
            "etcd://h:1",
            "etcd://h:1/",
            "etcd://h/p",
            "etcd://:1/p",
            "127.0.0.1:5050",
        ] {
            assert!(EtcdUrl::parse(bad).is_err(), "{bad}");
        }
    }
}
