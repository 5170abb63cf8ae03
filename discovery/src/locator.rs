//! [`MasterLocator`]: the address of the leading master.

use std::future::Future;
use std::pin::Pin;

/// Completes when the master a [`Located`] names stops leading.
pub type LeaderChanged = Pin<Box<dyn Future<Output = ()> + Send>>;

/// Where the leading master is now.
pub struct Located {
    /// Its `HOST:PORT` (or, for a fixed address, what was given).
    pub address: String,
    /// Completes when this master no longer leads (never, for a fixed
    /// address): a client connected to it then leaves and locates again.
    /// A deposed leader that is merely frozen still holds its connections
    /// open; this is how its clients leave it.
    pub changed: LeaderChanged,
}

/// Why the leading master could not be located.
#[derive(Debug, thiserror::Error)]
pub enum DiscoveryError {
    /// An `etcd://` address given to a build without the `etcd` feature.
    #[error("{0}: this build has no etcd support (build with the `etcd` feature)")]
    NoEtcdSupport(String),
    /// An `etcd://` address that is malformed.
    #[error("invalid etcd address {0:?}: expected etcd://HOST:PORT/PREFIX")]
    InvalidEtcdUrl(String),
    /// etcd answered, and no master leads right now.
    #[error("{0} has no leading master right now")]
    NoLeader(String),
    /// etcd could not be read.
    #[error("cannot read the leading master from {url}: {reason}")]
    Unreachable {
        /// The `etcd://` URL.
        url: String,
        /// Why.
        reason: String,
    },
}

/// Finds the leading master: a fixed address, or (feature `etcd`) the
/// leader recorded in etcd, watched (see the crate docs).
pub struct MasterLocator {
    kind: Kind,
}

enum Kind {
    Fixed(String),
    #[cfg(feature = "etcd")]
    Etcd(Box<crate::etcd::LeaderWatch>),
}

// === impl MasterLocator ===

impl MasterLocator {
    /// `etcd://HOST:PORT/PREFIX` follows the leader in etcd (feature
    /// `etcd`); anything else is a fixed address, taken as given (callers
    /// check its form). Needs no runtime: the watch starts on the first
    /// [`MasterLocator::locate`].
    pub fn new(master: &str) -> Result<MasterLocator, DiscoveryError> {
        if master.trim().starts_with("etcd://") {
            #[cfg(feature = "etcd")]
            {
                let url = crate::EtcdUrl::parse(master)?;
                return Ok(MasterLocator {
                    kind: Kind::Etcd(Box::new(crate::etcd::LeaderWatch::new(url)?)),
                });
            }
            #[cfg(not(feature = "etcd"))]
            return Err(DiscoveryError::NoEtcdSupport(master.trim().to_string()));
        }
        Ok(MasterLocator::fixed(master.trim()))
    }

    /// A master at `address`.
    pub fn fixed(address: impl Into<String>) -> MasterLocator {
        MasterLocator {
            kind: Kind::Fixed(address.into()),
        }
    }

    /// Whether the master is followed through etcd.
    pub fn follows_a_leader(&self) -> bool {
        !matches!(self.kind, Kind::Fixed(_))
    }

    /// The master to connect to now. `previous` is the one the client
    /// just lost or could not reach: while the record still names it, a
    /// different leader is awaited for [`NEW_LEADER_PATIENCE`] (a dead
    /// leader's record lives until its lease expires), then it is
    /// returned anyway.
    ///
    /// [`NEW_LEADER_PATIENCE`]: crate::NEW_LEADER_PATIENCE
    pub async fn locate(&self, previous: Option<&str>) -> Result<Located, DiscoveryError> {
        match &self.kind {
            Kind::Fixed(address) => {
                let _ = previous;
                Ok(Located {
                    address: address.clone(),
                    changed: Box::pin(std::future::pending()),
                })
            }
            #[cfg(feature = "etcd")]
            Kind::Etcd(watch) => watch.locate(previous).await,
        }
    }
}

impl std::fmt::Display for MasterLocator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.kind {
            Kind::Fixed(address) => f.write_str(address),
            #[cfg(feature = "etcd")]
            Kind::Etcd(watch) => write!(f, "{}", watch.url()),
        }
    }
}

impl std::fmt::Debug for MasterLocator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "MasterLocator({self})")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_fixed_address_is_the_master_for_good() {
        let locator = MasterLocator::new(" 127.0.0.1:5050 ").unwrap();
        assert!(!locator.follows_a_leader());
        let located = locator.locate(Some("127.0.0.1:5050")).await.unwrap();
        assert_eq!(located.address, "127.0.0.1:5050");
        let changed =
            tokio::time::timeout(std::time::Duration::from_millis(50), located.changed).await;
        assert!(changed.is_err(), "a fixed master never stops leading");
    }

    #[cfg(not(feature = "etcd"))]
    #[test]
    fn etcd_addresses_need_the_feature() {
        assert!(matches!(
            MasterLocator::new("etcd://127.0.0.1:2379/agora"),
            Err(DiscoveryError::NoEtcdSupport(_))
        ));
    }

    #[cfg(feature = "etcd")]
    #[test]
    fn etcd_addresses_are_followed() {
        let locator = MasterLocator::new("etcd://127.0.0.1:2379/agora").unwrap();
        assert!(locator.follows_a_leader());
        assert_eq!(locator.to_string(), "etcd://127.0.0.1:2379/agora");
        assert!(matches!(
            MasterLocator::new("etcd://127.0.0.1:2379"),
            Err(DiscoveryError::InvalidEtcdUrl(_))
        ));
    }
}
